package main

import (
	"os"
	"strings"
)

// historyHeading starts the part of docs/benchmarks.md that make bench
// keeps when it rewrites the file: dated figures of the headline rows,
// written by hand from the runs behind each change, so that a regression
// shows against them.
const historyHeading = "## History"

// keptHistory returns the history section of the file at path (from its
// heading to the end), or "" when the file or the section is missing.
func keptHistory(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.Index(s, "\n"+historyHeading+"\n")
	if i < 0 {
		return ""
	}
	return "\n" + s[i+1:]
}
