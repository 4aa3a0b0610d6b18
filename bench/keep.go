package main

import (
	"os"
	"strings"
)

// keptSections returns the sections of the results file at path that a
// run does not write: from its first "## " heading up to the history
// (historyHeading), e.g. the many-subscriptions tables and their notes,
// so that a run keeps them; "" when there are none.
func keptSections(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	start := strings.Index(s, "\n## ")
	if start < 0 {
		return ""
	}
	end := strings.Index(s, historyHeading)
	if end < 0 {
		end = len(s)
	}
	if end <= start {
		return ""
	}
	kept := strings.TrimSpace(s[start:end])
	if kept == "" {
		return ""
	}
	return kept + "\n\n"
}
