package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The results file (-out, docs/benchmarks.md) ends with the history of the
// headline rows, one line per run that wrote it, so that a regression shows
// against the runs before it. Each run keeps the section it finds and adds
// its own line.

// historyHeading starts the history section of the results file.
const historyHeading = "## History of the headline rows"

// historyHeader is the history table's header.
const historyHeader = "| date (UTC) | commit | sizes | drain ÷ bare publish | consumer ÷ bare loop | ordered ÷ unordered (1, 2 replicas; steady) | end to end p50, p99 (rate reached) | load average (1 min, at the end) | CPU per delivery, consumer ÷ receiver |\n|---|---|---|---|---|---|---|---|---|\n"

// historyHeaderV1 is the header before the consumer ÷ receiver column;
// readHistory replaces it with historyHeader (its lines then have an
// empty last cell, which Markdown allows).
const historyHeaderV1 = "| date (UTC) | commit | sizes | drain ÷ bare publish | consumer ÷ bare loop | ordered ÷ unordered (1, 2 replicas; steady) | end to end p50, p99 (rate reached) | load average (1 min, at the end) |\n|---|---|---|---|---|---|---|---|\n"

// readHistory returns the history section of the results file at path,
// from its heading to the end, or a new empty section when there is none.
func readHistory(path string) string {
	b, err := os.ReadFile(path)
	if err == nil {
		if i := strings.Index(string(b), historyHeading); i >= 0 {
			h := strings.Replace(string(b[i:]), historyHeaderV1, historyHeader, 1)
			return strings.TrimRight(h, "\n") + "\n"
		}
	}
	return historyHeading + "\n\n" + historyHeader
}

// historyLine is this run's line of the history table: the ratios of the
// headline rows found in rows ("—" for a row not run).
func historyLine(cfg config, rows []row, repo string) string {
	find := func(prefix string, ours bool) string {
		for _, r := range rows {
			if strings.HasPrefix(r.Name, prefix) {
				if ours {
					return r.Ours
				}
				return r.Ratio
			}
		}
		return "—"
	}
	cpu := find(consumerCPURow, false)
	if c := find(consumerCPURow, true); c != "—" {
		cpu += " (" + c + ")"
	}
	size := "full"
	if cfg.Quick {
		size = "quick"
	}
	load := loadAverage()
	ordered := find("ordered delivery, 1 replica", false) + ", " + find("ordered delivery, 2 replica", false)
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
		time.Now().UTC().Format("2006-01-02 15:04"), commit(repo), size,
		find("drain throughput", false), find("consumer throughput", false), ordered, find("end to end: append", true), load, cpu)
}

// loadAverage is the machine's 1-minute load average, as /proc/loadavg
// prints it; "?" when it cannot be read.
func loadAverage() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			return f[0]
		}
	}
	return "?"
}

// commit is the short commit of the repository at repo, with "+changes"
// when its work tree, docs/benchmarks.md aside, differs from it; "?" when
// git cannot tell.
func commit(repo string) string {
	out, err := exec.Command("git", "-C", repo, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "?"
	}
	c := strings.TrimSpace(string(out))
	// The results file itself does not count: a run writes it, and the
	// history of earlier runs in it may be edited by hand.
	if st, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/benchmarks.md").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "+changes"
	}
	return c
}
