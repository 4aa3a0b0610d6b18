package throttle

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// The throttle's AIMD on the engine's clock: the first 429 cuts to 3/4 of
// the rate accepted, a 429 of a request sent before the cut cuts no more,
// the rate grows back by a step a second, a minute without a cut lifts
// it, and a Retry-After holds every POST until it passes.
func TestThrottleAIMD(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	th := New(clock, 0, nil)
	ctx := context.Background()
	require.False(t, holding(th))
	require.True(t, math.IsInf(th.Rate(), 1))

	var gen uint64
	for range 8 {
		g, err := th.Wait(ctx) // no limit: at once
		require.NoError(t, err)
		gen = g
		if th.Observe(g, Answer{Accepted: true}) {
			t.Fatal("a 2xx is no throttling answer")
		}
	}
	require.True(t, th.Observe(gen, Answer{Throttled: true, RetryAfter: -1}))
	require.Equal(t, 6.0, th.Rate(), "3/4 of the 8 accepted")
	require.True(t, th.Observe(gen, Answer{Throttled: true, RetryAfter: -1}))
	require.Equal(t, 6.0, th.Rate(), "sent before the cut: no second cut")
	require.True(t, holding(th))

	clock.Advance(2 * time.Second)
	_, err := th.Wait(ctx)
	require.NoError(t, err)
	require.InDelta(t, 8.4, th.Rate(), 1e-9, "two seconds: two steps of 1.2 (a fifth of the cut rate, at least 0.5)")
	clock.Advance(throttleLift)
	_, err = th.Wait(ctx)
	require.NoError(t, err)
	require.True(t, math.IsInf(th.Rate(), 1), "a minute without a cut lifts it")

	// A 503 with Retry-After pauses every POST.
	g, _ := th.Wait(ctx)
	require.True(t, th.Observe(g, Answer{Throttled: true, RetryAfter: 3 * time.Second}))
	done := make(chan struct{})
	go func() {
		_, _ = th.Wait(ctx)
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
	capped := New(clock, 2, nil)
	require.Equal(t, 2.0, capped.Rate())
}

// After a 429 storm the rate grows back within seconds of the first 2xx:
// ten seconds of 429 with Retry-After 1 at 100 events/s (one cut a round,
// no 2xx between them) leave about 5.6/s; from the first 2xx to a request
// sent after the last cut the rate doubles each second, and at the 100/s
// the endpoint accepted before the storm the cut is gone (no limit, as
// before it). Before that 2xx it only grows by the additive step; a 2xx
// to a request sent before the cut starts nothing; a single cut that the
// endpoint then accepts is the AIMD of TestThrottleAIMD, no slow start.
func TestThrottleRecoversWithinSecondsOfTheFirst2xx(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tick := func(th *Throttle) float64 { // one second, then a POST
		clock.Advance(time.Second)
		th.mu.Lock()
		th.grow(clock.Now())
		th.mu.Unlock()
		return th.Rate()
	}
	storm := func(th *Throttle, rounds int) {
		for range 100 {
			require.False(t, th.Observe(th.gen, Answer{Accepted: true}))
		}
		for round := range rounds {
			before := th.gen
			require.True(t, th.Observe(th.gen, Answer{Throttled: true, RetryAfter: time.Second}))
			if round == 0 && th.ceiling == rate.Inf {
				require.Equal(t, 75.0, th.Rate(), "3/4 of the 100 accepted")
				th.Observe(before, Answer{Accepted: true}) // sent before the cut: no recovery
			}
			clock.Advance(time.Second)
		}
	}

	th := New(clock, 0, nil)
	storm(th, 10)
	low := th.Rate()
	require.InDelta(t, 75*math.Pow(0.75, 9), low, 1e-3, "ten cuts in a row")
	// No 2xx yet: the additive step only (three seconds since the cut).
	step := max(throttleMinStep, float64(th.atCut)*throttleStepShare)
	tick(th)
	require.InDelta(t, low+3*step, tick(th), 1e-9, "before any 2xx")

	require.False(t, th.Observe(th.gen, Answer{Accepted: true}), "the first 2xx")
	var seconds int
	for !math.IsInf(th.Rate(), 1) {
		seconds++
		require.LessOrEqual(t, seconds, 5, "back to no limit within 5 s of the first 2xx")
		r := th.Rate()
		if got := tick(th); !math.IsInf(got, 1) {
			require.Equal(t, 2*r, got, "second %d: doubles", seconds)
		}
	}
	t.Logf("from %.2f/s to no limit in %d s of 2xx", low+3*step, seconds)
	require.False(t, holding(th), "nothing held: the storm is undone")

	// With a rate_limit, it comes back to the rate_limit.
	capped := New(clock, 150, nil)
	storm(capped, 10)
	require.False(t, capped.Observe(capped.gen, Answer{Accepted: true}))
	for range 6 {
		tick(capped)
	}
	require.Equal(t, 150.0, capped.Rate())

	// One cut, then 2xx: additive increase, as before.
	one := New(clock, 0, nil)
	storm(one, 1)
	require.False(t, one.Observe(one.gen, Answer{Accepted: true}))
	require.InDelta(t, 75+2*15, tick(one), 1e-9, "two seconds since the cut: a fifth of the cut rate each, no doubling")
}

// holding reports whether t's wait may block: a rate or a pause in force.
func holding(t *Throttle) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur != rate.Inf || t.clock.Now().Before(t.paused)
}
