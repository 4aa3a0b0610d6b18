package drain_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// waitLeased waits (at most 10 s) until owner holds n leases and returns
// those it holds then. Handlers call it, off the test goroutine, so it
// asserts nothing itself.
func (b bundle) waitLeased(owner string, n int) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := b.leasedBy(owner)
		if err == nil && len(held) == n || time.Now().After(deadline) {
			return held
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// leasedBy returns the streams owner holds a live lease on (a postponed
// stream keeps its last holder's name with an expired lease).
func (b bundle) leasedBy(owner string) ([]string, error) {
	infos, err := b.store.Streams(b.ctx, store.StreamFilter{})
	var out []string
	for _, in := range infos {
		if in.LeasedBy == owner && in.LeasedUntil.After(time.Now()) {
			out = append(out, in.Stream)
		}
	}
	return out, err
}

func (b bundle) leased(t *testing.T, owner string) []string {
	t.Helper()
	held, err := b.leasedBy(owner)
	require.NoError(t, err)
	return held
}

// While a cycle that found a backlog is handled, the next one is claimed
// and fetched; everything is still handled once, in order.
func TestRunReadsAheadWhileHandling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	streams := []string{"ahead-a", "ahead-b", "ahead-c", "ahead-d", "ahead-e", "ahead-f"}
	for _, s := range streams {
		b.appendN(t, s, 3)
	}
	rec := newRecorder(nil)
	first := true
	sawAhead := make(chan []string, 1)
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		if first {
			first = false
			// The first cycle claimed ClaimLimit streams: a backlog. Wait
			// until the next cycle holds its streams too.
			sawAhead <- b.waitLeased("reader", 4)
		}
		return rec.Handle(ctx, batches)
	})
	d := b.drain(t, h, drain.Config{Owner: "reader", ClaimLimit: 2, PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	require.Len(t, <-sawAhead, 4, "the next cycle is claimed while this one is handled")
	require.Eventually(t, func() bool { return rec.count() == 3*len(streams) }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	for _, s := range streams {
		require.Equal(t, seq(3), rec.versions(s), "stream %s once, in order", s)
		require.Equal(t, int64(2), b.info(t, s).Watermark)
	}
	require.Empty(t, b.leased(t, "reader"))
}

// A cycle claimed ahead is given back untried, without counting a retry,
// when the cycle being handled starts an outage and the run pauses.
func TestRunGivesBackTheCycleReadAheadWhenAnOutageStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, s := range []string{"gb-a", "gb-b", "gb-c", "gb-d"} {
		b.appendN(t, s, 1)
	}
	handled := make(chan []string, 1)
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		b.waitLeased("pauser", 4) // the next cycle is read ahead
		out := make([]drain.Result, len(batches))
		var names []string
		for i, bt := range batches {
			names = append(names, bt.Stream)
			out[i] = drain.Result{Err: drain.Unavailable(errors.New("nats: no responders available for request"))}
		}
		handled <- names
		return out
	})
	// The outage pause starts at PollInterval: an hour, so the state after
	// the first cycle stays put while the test looks at it.
	d := b.drain(t, h, drain.Config{Owner: "pauser", ClaimLimit: 2, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	tried := <-handled
	require.Len(t, tried, 2)
	require.Eventually(t, func() bool { return len(b.leased(t, "pauser")) == 0 }, 10*time.Second, 5*time.Millisecond,
		"the streams read ahead are given back")
	for _, s := range []string{"gb-a", "gb-b", "gb-c", "gb-d"} {
		in := b.info(t, s)
		if in.Stream == tried[0] || in.Stream == tried[1] {
			require.False(t, in.NextAttempt.IsZero(), "%s was tried during the outage: it backs off", s)
			require.Zero(t, in.Retry, "%s: an outage counts no retry", s)
		} else {
			require.Zero(t, in.Retry, "%s was read ahead, not tried: no retry counted", s)
			require.True(t, in.NextAttempt.IsZero(), "%s can be claimed at once", s)
		}
	}
	cancel()
	require.NoError(t, <-done)
}

// A cycle claimed ahead whose handler would have less than half of
// HandlerTimeout left, because the cycle handled meanwhile took long, is
// given back and claimed afresh: its publishes are not cut short by a
// deadline that is no fault of the bus's.
func TestRunClaimsAfreshWhenTheCycleReadAheadIsStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	streams := []string{"stale-a", "stale-b", "stale-c", "stale-d"}
	for _, s := range streams {
		b.appendN(t, s, 2)
	}
	// The drain's clock is fake: the test moves it past half the read-ahead
	// cycle's handler time instead of waiting; the leases (an hour, on the
	// database's clock) never run out meanwhile.
	const lease = time.Hour
	clock := newWaitClock()
	rec := newRecorder(nil)
	first := true
	var left []time.Duration
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		deadline, _ := ctx.Deadline()
		left = append(left, clock.Until(deadline))
		if first {
			first = false
			// Hold on until the cycle is read ahead, then let the clock
			// run until it has less than half its handler's time left.
			b.waitLeased("slow", 4)
			clock.Advance(drain.HandlerTimeout(lease)/2 + time.Millisecond)
		}
		return rec.Handle(ctx, batches)
	})
	d := b.drain(t, h, drain.Config{Owner: "slow", Lease: lease, ClaimLimit: 2, PollInterval: 20 * time.Millisecond, Clock: clock})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Equal(t, 20*time.Millisecond, clock.next(t), "idle once both cycles are done")
	require.Equal(t, 2*len(streams), rec.count())
	cancel()
	require.NoError(t, <-done)

	require.Len(t, left, 2)
	require.Equal(t, drain.HandlerTimeout(lease), left[0])
	require.Equal(t, drain.HandlerTimeout(lease), left[1], "the second cycle was claimed afresh, not handed over stale")
	for _, s := range streams {
		require.Equal(t, seq(2), rec.versions(s), "stream %s once, in order", s)
		require.Zero(t, b.info(t, s).Retry)
	}
}

// settleWatch is the real store, whose first AckStreams waits (at most
// 5 s) for a second Claim (the next cycle's, the first being the acked
// cycle's own) before it acks, and records whether one came. The next
// cycle's claim may begin just before the ack or during it: both overlap
// the settle.
type settleWatch struct {
	drain.Store
	claims     atomic.Int32
	claimed    chan struct{}
	acks       atomic.Int32
	overlapped atomic.Bool
}

func (s *settleWatch) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]event.Claim, error) {
	s.claims.Add(1)
	select {
	case s.claimed <- struct{}{}:
	default:
	}
	return s.Store.Claim(ctx, owner, limit, lease)
}

func (s *settleWatch) AckStreams(ctx context.Context, owner string, acks []event.Progress) []error {
	if s.acks.Add(1) == 1 {
		deadline := time.After(5 * time.Second)
	wait:
		for s.claims.Load() < 2 {
			select {
			case <-s.claimed:
			case <-deadline:
				break wait
			}
		}
		s.overlapped.Store(s.claims.Load() >= 2)
	}
	return s.Store.AckStreams(ctx, owner, acks)
}

// Once a cycle that is no backlog has been handled, the next cycle is
// claimed while it settles: an event appended during the handler waits
// for the handler, not for the ack too; both are handled once, in order.
func TestRunClaimsTheNextCycleWhileThisOneSettles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "settle-a", 1)
	rec := newRecorder(nil)
	first := true
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		if first {
			first = false
			b.appendN(t, "settle-b", 1) // appended after the claim
		}
		return rec.Handle(ctx, batches)
	})
	s := &settleWatch{Store: b.store, claimed: make(chan struct{}, 1)}
	d, err := drain.New(s, h, drain.Config{Owner: "settler", PollInterval: 20 * time.Millisecond, Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	require.Eventually(t, func() bool { return rec.count() == 2 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return len(b.leased(t, "settler")) == 0 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.True(t, s.overlapped.Load(), "the next cycle's claim began before the first cycle's ack ended")
	require.Equal(t, seq(1), rec.versions("settle-a"))
	require.Equal(t, seq(1), rec.versions("settle-b"))
	require.Equal(t, int64(0), b.info(t, "settle-b").Watermark)
}
