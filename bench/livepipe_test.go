package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The percentiles the rows print: quantile takes the element at
// ⌊n·q⌋, the last for q near 1.
func TestQuantileAndPercentiles(t *testing.T) {
	d := make([]time.Duration, 1000)
	for i := range d {
		d[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 501 * time.Millisecond}, {0.99, 991 * time.Millisecond}, {0.999, 1000 * time.Millisecond}, {1, 1000 * time.Millisecond}} {
		if got := quantile(d, c.q); got != c.want {
			t.Errorf("quantile(1..1000 ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if quantile(nil, 0.99) != 0 {
		t.Error("quantile of nothing is not 0")
	}
	if got := livePercentiles(d); got != "p50 501.00 ms p99 991.00 ms p99.9 1000.00 ms" {
		t.Errorf("livePercentiles = %q", got)
	}
	if got := livePercentiles(nil); got != "none" {
		t.Errorf("livePercentiles(nil) = %q", got)
	}
}

func TestLiveRatio(t *testing.T) {
	if got := liveRatio(3, 2); got != "1.50" {
		t.Errorf("liveRatio(3, 2) = %q", got)
	}
	if got := liveRatio(3, 0); got != "—" {
		t.Errorf("liveRatio(3, 0) = %q", got)
	}
}

// Per webhook: the pipeline's processes (not the generator, the
// receiver or the appends' sessions) over events × subscriptions.
func TestLivePipeFiguresPerWebhook(t *testing.T) {
	f := livePipeFigures{events: 1000, subs: []string{liveSubOrdered, liveSubUnordered}, cpu: map[string]time.Duration{
		"bridge": 100 * time.Millisecond, "consumer": 200 * time.Millisecond, "server": 300 * time.Millisecond,
		"postgres: pipeline": 400 * time.Millisecond, "generator": time.Second, "receiver": time.Second, "postgres: appends": time.Second,
	}}
	if got := f.perWebhook(); got != 500 {
		t.Fatalf("perWebhook = %v µs, want 500 (1 s over 2,000 webhooks)", got)
	}
	f.commits = 1050
	if got := f.commitsPerEvent(); math.Abs(got-0.05) > 1e-9 {
		t.Fatalf("commitsPerEvent = %v, want 0.05", got)
	}
}

func TestLiveHeld(t *testing.T) {
	for _, c := range []struct {
		late    time.Duration
		backlog map[string]int
		want    bool
	}{
		{0, map[string]int{"a": 1000, "b": 0}, true},
		{0, map[string]int{"a": 1001}, false},
		{2 * time.Second, map[string]int{"a": 0}, false},
	} {
		if got := liveHeld(1000, c.late, c.backlog); got != c.want {
			t.Errorf("liveHeld(1000, %v, %v) = %v, want %v", c.late, c.backlog, got, c.want)
		}
	}
}

// One stream's service time is read where its webhooks waited for each
// other: the second stored in EVENTS before the first was received.
func TestWaitingGap(t *testing.T) {
	at := func(ms int) time.Time { return time.UnixMilli(int64(ms)) }
	ready := []time.Time{at(0), at(1), at(2), at(100)}
	received := []time.Time{at(10), at(16), at(22), at(110)}
	if got := waitingGap(ready, received); got != 6*time.Millisecond {
		t.Fatalf("waitingGap = %v, want 6ms", got)
	}
	if got := waitingGap(ready[3:], received[3:]); got != 0 {
		t.Fatalf("waitingGap of one = %v, want 0", got)
	}
	if got := orderedCeiling(5*time.Millisecond, 5*time.Millisecond); got != 100 {
		t.Fatalf("orderedCeiling(5ms, 5ms) = %v, want 100", got)
	}
}

// A run of ours alone (-live-pipelines bridge) judges no target that
// is relative to the bare reference: its rows say why instead of a
// ratio against zero.
func TestLivePipeRateRowsWithoutBare(t *testing.T) {
	e := &env{cfg: config{LiveDelay: 5 * time.Millisecond, LivePipeStreams: 10_000, LiveZipf: liveZipfExponent}}
	ours := livePipeFigures{rate: 1000, events: 1000, subs: []string{liveSubOrdered, liveSubUnordered},
		cpu:        map[string]time.Duration{"bridge": 100 * time.Millisecond},
		fromCommit: map[string][]time.Duration{liveSubOrdered: {time.Millisecond}, liveSubUnordered: {time.Millisecond}}}
	judged := 0
	for _, r := range e.livePipeRateRows(ours, livePipeFigures{}, "durable") {
		if !strings.Contains(r.Target, "≤ 1.3") && !strings.Contains(r.Target, "bare's + 5 ms") {
			continue
		}
		judged++
		if r.Met || !strings.Contains(r.Reference, "bare not run") || strings.Contains(r.Ratio, "e+") || len(r.Ratio) > 12 {
			t.Errorf("row %q without bare: met %v, reference %q, ratio %q", r.Target, r.Met, r.Reference, r.Ratio)
		}
	}
	if judged != 2 {
		t.Fatalf("found %d target rows relative to bare, want 2", judged)
	}
}
