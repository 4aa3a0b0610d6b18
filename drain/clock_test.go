package drain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

// waitClock is a fake clock that tells the test about every timer the
// drain starts (its pauses, the idle poll, ShutdownGrace), so a test
// knows what the drain waits for and advances the clock by exactly that.
type waitClock struct {
	*clockwork.FakeClock
	timers chan time.Duration
}

func newWaitClock() waitClock {
	return waitClock{FakeClock: clockwork.NewFakeClock(), timers: make(chan time.Duration, 100)}
}

func (c waitClock) NewTimer(d time.Duration) clockwork.Timer {
	t := c.FakeClock.NewTimer(d)
	c.timers <- d
	return t
}

// next returns the duration of the next timer the drain starts.
func (c waitClock) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.timers:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the drain started no timer")
		return 0
	}
}

func TestHandlerDeadlineOnTheClock(t *testing.T) {
	t.Parallel()
	// The handler's deadline is on the drain's clock; see
	// TestRunClaimsAfreshWhenTheCycleReadAheadIsStale for it in a run. Here:
	// the deadline's error is DeadlineExceeded, as the forwarder's
	// classification of a cut-short publish expects.
	c := clockwork.NewFakeClock()
	ctx, cancel := drain.WithDeadlineForTest(c, c.Now().Add(time.Second))
	defer cancel()
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	require.Equal(t, c.Now().Add(time.Second), dl)
	c.Advance(time.Second - time.Nanosecond)
	require.NoError(t, ctx.Err())
	c.Advance(time.Nanosecond)
	<-ctx.Done()
	require.True(t, errors.Is(ctx.Err(), context.DeadlineExceeded))
}
