package main

import (
	"fmt"
	"strings"
	"syscall"
	"time"
)

// rowTimes is how long each row of a run took, in the order they ran:
// wall clock (start-up and loading included) and the CPU time of this
// process (the JetStream server, the in-process bridge and consumer, the
// receivers) and of the child processes it has reaped (Postgres not
// counted). On a busy machine the wall clock stretches while the CPU time
// holds; on an idle 2-core machine a row takes at least half its CPU time.
// It tells what to shrink when a quick run passes its 3 minutes.
type rowTimes struct {
	names    []string
	took     []time.Duration
	cpu      []time.Duration
	cur      time.Time
	cpuStart time.Duration
}

// start ends the row running (printing its times) and starts name; ""
// only ends the row running.
func (t *rowTimes) start(name string) {
	now, cpu := time.Now(), cpuWithChildren()
	if n := len(t.names); n > 0 && !t.cur.IsZero() {
		t.took[n-1], t.cpu[n-1] = now.Sub(t.cur), cpu-t.cpuStart
		fmt.Printf("bench: row %s took %s (CPU %s)\n", t.names[n-1], t.took[n-1].Round(100*time.Millisecond), t.cpu[n-1].Round(100*time.Millisecond))
	}
	t.cur = time.Time{}
	if name != "" {
		t.names, t.took, t.cpu = append(t.names, name), append(t.took, 0), append(t.cpu, 0)
		t.cur, t.cpuStart = now, cpu
	}
}

// String is "drain 21s (CPU 30s), claim 9s (CPU 6s), …".
func (t rowTimes) String() string {
	parts := make([]string, len(t.names))
	for i, n := range t.names {
		parts[i] = fmt.Sprintf("%s %s (CPU %s)", n, t.took[i].Round(time.Second), t.cpu[i].Round(time.Second))
	}
	return strings.Join(parts, ", ")
}

// cpuWithChildren is the CPU time (user + system) of this process and of
// its reaped children so far.
func cpuWithChildren() time.Duration {
	var self, children syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) != nil || syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) != nil {
		return 0
	}
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano())
}
