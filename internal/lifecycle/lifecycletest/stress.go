// Package lifecycletest checks a lifecycle.Part against its contract:
// Stress starts and stops it from many goroutines at once, round after
// round (River's startstoptest.Stress is the model).
package lifecycletest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
)

// stopWait bounds one Stop: a part that does not stop within it fails
// the test (a generous bound on a loaded machine, not a speed check).
const stopWait = 30 * time.Second

// Stress runs rounds rounds; each starts p, waits for Started, then has
// workers goroutines (0: 8) each call Start (with ctx), Started and
// Stopped, or Stop on p at once, in a mixed order;
// after each round it stops p and checks that Stop returned and Stopped
// is closed. It fails t on a Start error other than context.Canceled
// (a Stop during the opening), or a Stop that does not return. Goroutines left behind are
// for the caller to check (goleak) after Stress returns.
func Stress(t testing.TB, ctx context.Context, p lifecycle.Part, rounds, workers int) {
	t.Helper()
	if workers <= 0 {
		workers = 8
	}
	for round := range rounds {
		// Each round begins with p running (or its opening failed), so
		// that the Stops below meet a run, not only Starts.
		if err := p.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("round %d: Start: %v", round, err)
		}
		<-p.Started()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				switch (round + w) % 4 {
				case 0, 1:
					// A Stop during the opening cancels it: that error is
					// the contract's, not a failure.
					if err := p.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
						t.Errorf("round %d: Start: %v", round, err)
					}
				case 2:
					_, _ = p.Started(), p.Stopped()
				case 3:
					p.Stop()
				}
			})
		}
		wg.Wait()
		stopOrFail(t, p, round)
	}
}

// stopOrFail stops p and checks that Stop returns and Stopped is closed.
func stopOrFail(t testing.TB, p lifecycle.Part, round int) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); p.Stop() }()
	timer := time.NewTimer(stopWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("round %d: Stop did not return in %s", round, stopWait)
	}
	select {
	case <-p.Stopped():
	default:
		t.Fatalf("round %d: Stopped is not closed after Stop", round)
	}
}
