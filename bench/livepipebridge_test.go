package main

import (
	"strconv"
	"testing"
	"time"
)

// TestStreamWaitsSortsEventsByTheirStreamAtCommit checks the classes of
// commit → stored in EVENTS: behind the stream's previous event (stored
// after this one's commit), just after it (stored within liveAckWindow
// before), and free (the first of a stream, or long after).
func TestStreamWaitsSortsEventsByTheirStreamAtCommit(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	commits := map[string]liveCommit{}
	stored := map[string]liveStored{}
	add := func(id, stream, commit, store int) {
		commits[strconv.Itoa(id)] = liveCommit{stream: stream, at: at(commit)}
		stored[strconv.Itoa(id)] = liveStored{at: at(store)}
	}
	// Stream 1: the first free, the second committed before the first was
	// stored (behind), the third 5 ms after the second was stored (just
	// after), the fourth 100 ms after the third (free).
	add(1, 1, 0, 4)
	add(2, 1, 2, 9)
	add(3, 1, 14, 17)
	add(4, 1, 117, 119)
	// Stream 2: one event, free.
	add(5, 2, 1, 3)
	// An event never stored counts nowhere.
	commits["6"] = liveCommit{stream: 2, at: at(50)}

	w := streamWaits(commits, stored)
	want := liveWaits{
		{7 * time.Millisecond},
		{3 * time.Millisecond},
		{2 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond},
	}
	for i := range want {
		if len(w[i]) != len(want[i]) {
			t.Fatalf("class %q: got %v, want %v", liveWaitClass[i], w[i], want[i])
		}
		for j := range want[i] {
			if w[i][j] != want[i][j] {
				t.Fatalf("class %q: got %v, want %v", liveWaitClass[i], w[i], want[i])
			}
		}
	}
	if got, want := w.tailShare(), "of the events at or past the p99 (7.00 ms): 100 % / 0 % / 0 %"; got != want {
		t.Fatalf("tailShare: got %q, want %q", got, want)
	}
}

// TestSessionWaitsLine checks the wait events' classes and the line.
func TestSessionWaitsLine(t *testing.T) {
	w := sessionWaits{"app": {}}
	for _, e := range [][2]string{{"", ""}, {"", ""}, {"LWLock", "WALWrite"}, {"IO", "WALSync"}, {"Lock", "transactionid"}, {"Lock", "advisory"}, {"IPC", "ProcArrayGroupUpdate"}, {"", ""}} {
		w["app"][waitKind(e[0], e[1])]++
	}
	got := w.line("app", "the app's")
	want := "the app's 8 active samples: CPU 38 %, WAL flush 25 %, row lock 12 %, other lock 12 %, other 12 %"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
