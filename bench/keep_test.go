package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestKeptSectionsAreThoseBetweenTheTableAndTheHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	file := "# Benchmarks\n\nintro\n\n| row |\n|---|\n| a |\n\n## Many subscriptions\n\ntable\n\n## Other\n\nnotes\n\n" + historyHeading + "\n\n| h |\n"
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "## Many subscriptions\n\ntable\n\n## Other\n\nnotes\n\n"
	if got := keptSections(path); got != want {
		t.Fatalf("keptSections = %q, want %q", got, want)
	}
	if err := os.WriteFile(path, []byte("# Benchmarks\n\n| row |\n\n"+historyHeading+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := keptSections(path); got != "" {
		t.Fatalf("keptSections without sections = %q, want \"\"", got)
	}
	if got := keptSections(filepath.Join(t.TempDir(), "absent.md")); got != "" {
		t.Fatalf("keptSections of a missing file = %q, want \"\"", got)
	}
}
