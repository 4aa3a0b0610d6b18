package drain_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// After a light cycle Run waits Linger before it claims again, so the
// events appended meanwhile, over several streams, go in one cycle; an
// idle Run still waits for a notification or PollInterval.
func TestRunLingersAfterALightCycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, handled := cycleRecorder()
	const linger, poll = 7 * time.Hour, time.Hour
	clock := newWaitClock()
	d := b.drain(t, h, drain.Config{Linger: linger, PollInterval: poll, Clock: clock, Notifier: b.store})
	b.appendN(t, "linger-1", 1)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Equal(t, linger, clock.next(t), "a light cycle lingers")
	require.Equal(t, [][]string{{"linger-1"}}, handled())
	// 7 hours outlast the default lease: the wait comes after the acks.
	require.Equal(t, int64(0), b.info(t, "linger-1").Watermark, "acked before the wait")
	b.appendN(t, "linger-2", 2)
	b.appendN(t, "linger-3", 1)
	require.Len(t, handled(), 1, "nothing claimed while lingering")

	clock.Advance(linger)
	require.Equal(t, linger, clock.next(t), "the next light cycle lingers too")
	got := handled()
	require.Len(t, got, 2)
	require.ElementsMatch(t, []string{"linger-2", "linger-3"}, got[1], "one cycle for what came meanwhile")

	clock.Advance(linger)
	require.Equal(t, poll, clock.next(t), "a cycle that claimed nothing waits as before")
	b.appendN(t, "linger-4", 1)
	require.Eventually(t, func() bool { return len(handled()) == 3 }, 10*time.Second, 5*time.Millisecond,
		"a notification wakes an idle Run at once")
}

func TestNewRejectsNegativeLinger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := drain.New(b.store, newRecorder(nil), drain.Config{Linger: -time.Millisecond})
	require.ErrorIs(t, err, drain.ErrInvalidConfig)
	require.ErrorContains(t, err, "Config.Linger -1ms")
}

// ackCounter is the Postgres store, counting the calls that settle:
// acks alone, and acks made with the next claim.
type ackCounter struct {
	*store.Store
	mu               sync.Mutex
	acks, withClaims int
}

func (a *ackCounter) AckStreams(ctx context.Context, owner string, acks []event.Progress) []error {
	a.mu.Lock()
	a.acks++
	a.mu.Unlock()
	return a.Store.AckStreams(ctx, owner, acks)
}

func (a *ackCounter) AckClaim(ctx context.Context, owner string, acks []event.Progress, limit int, lease time.Duration, perStream int) ([]error, []event.Claim, []event.Event, bool, error) {
	a.mu.Lock()
	if len(acks) > 0 {
		a.withClaims++
	}
	a.mu.Unlock()
	return a.Store.AckClaim(ctx, owner, acks, limit, lease, perStream)
}

func (a *ackCounter) counts() (acks, withClaims int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acks, a.withClaims
}

// A lingering Run waits before a light cycle's acks, and makes them with
// the claim that follows the wait, in one call: the events appended
// meanwhile to that cycle's stream and to others go in the next cycle,
// and no cycle acks on its own.
func TestRunLingersBeforeTheAcksThatGoWithTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counter := &ackCounter{Store: b.store}
	h, handled := cycleRecorder()
	const linger, poll = 7 * time.Hour, time.Hour
	clock := newWaitClock()
	// The leases outlast the linger: the wait fits before the acks.
	d, err := drain.New(counter, h, drain.Config{Linger: linger, Lease: 100 * time.Hour, PollInterval: poll, Clock: clock, Notifier: b.store, Logger: quiet()})
	require.NoError(t, err)
	b.appendN(t, "ackl-1", 1)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Equal(t, linger, clock.next(t), "a light cycle lingers")
	require.Equal(t, [][]string{{"ackl-1"}}, handled())
	acks, withClaims := counter.counts()
	require.Zero(t, acks+withClaims, "not acked before the wait")
	b.appendN(t, "ackl-1", 1) // to the stream the lingering cycle holds
	b.appendN(t, "ackl-2", 1)

	clock.Advance(linger)
	require.Equal(t, linger, clock.next(t), "the next light cycle lingers too")
	got := handled()
	require.Len(t, got, 2)
	require.ElementsMatch(t, []string{"ackl-1", "ackl-2"}, got[1], "the held stream taken again with the acks, and the other")
	acks, withClaims = counter.counts()
	require.Equal(t, 0, acks, "no ack on its own")
	require.Equal(t, 1, withClaims, "the first cycle's ack went with the second's claim")

	clock.Advance(linger)
	require.Equal(t, poll, clock.next(t), "the claim with the acks found nothing: idle")
	acks, withClaims = counter.counts()
	require.Equal(t, 0, acks)
	require.Equal(t, 2, withClaims)
	require.Equal(t, int64(1), b.info(t, "ackl-1").Watermark, "acked to its last event")
}

// cycleRecorder returns a handler that forwards every batch whole and
// records the streams of each Handle call, and handled, which returns
// those calls so far.
func cycleRecorder() (drain.HandlerFunc, func() [][]string) {
	var mu sync.Mutex
	var cycles [][]string
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		var streams []string
		for i, bt := range batches {
			streams = append(streams, bt.Stream)
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		mu.Lock()
		cycles = append(cycles, streams)
		mu.Unlock()
		return out
	})
	return h, func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return append([][]string(nil), cycles...)
	}
}
