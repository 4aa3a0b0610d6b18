package deliver

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// The throttle's AIMD on the engine's clock: the first 429 cuts to 3/4 of
// the rate accepted, a 429 of a request sent before the cut cuts no more,
// the rate grows back by a step a second, a minute without a cut lifts
// it, and a Retry-After holds every POST until it passes.
func TestThrottleAIMD(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	th := newThrottle(clock, 0, nil)
	ctx := context.Background()
	require.False(t, th.holding())
	require.True(t, math.IsInf(th.rate(), 1))

	var gen uint64
	for range 8 {
		g, err := th.wait(ctx) // no limit: at once
		require.NoError(t, err)
		gen = g
		if th.observe(response{status: 200}, g) {
			t.Fatal("a 2xx is no throttling answer")
		}
	}
	require.True(t, th.observe(response{status: 429, retryAfter: -1}, gen))
	require.Equal(t, 6.0, th.rate(), "3/4 of the 8 accepted")
	require.True(t, th.observe(response{status: 429, retryAfter: -1}, gen))
	require.Equal(t, 6.0, th.rate(), "sent before the cut: no second cut")
	require.True(t, th.holding())

	clock.Advance(2 * time.Second)
	_, err := th.wait(ctx)
	require.NoError(t, err)
	require.InDelta(t, 8.4, th.rate(), 1e-9, "two seconds: two steps of 1.2 (a fifth of the cut rate, at least 0.5)")
	clock.Advance(throttleLift)
	_, err = th.wait(ctx)
	require.NoError(t, err)
	require.True(t, math.IsInf(th.rate(), 1), "a minute without a cut lifts it")

	// A 503 with Retry-After pauses every POST.
	g, _ := th.wait(ctx)
	require.True(t, th.observe(response{status: 503, retryAfter: 3 * time.Second}, g))
	done := make(chan struct{})
	go func() {
		_, _ = th.wait(ctx)
		close(done)
	}()
	clock.BlockUntilContext(ctx, 1)
	select {
	case <-done:
		t.Fatal("sent during Retry-After")
	default:
	}
	clock.Advance(3 * time.Second)
	clock.Advance(time.Second) // the rate's interval after the cut
	<-done

	// A configured RateLimit is the ceiling.
	capped := newThrottle(clock, 2, nil)
	require.Equal(t, 2.0, capped.rate())
}
