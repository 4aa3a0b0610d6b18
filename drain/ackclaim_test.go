package drain_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/store"
)

// claimCounter is an Observer that counts claims and what they took.
type claimCounter struct {
	claims, streams atomic.Int64
}

func (c *claimCounter) Claimed(streams int, _ time.Duration, _ error) {
	c.claims.Add(1)
	c.streams.Add(int64(streams))
}
func (*claimCounter) Settled(string, string, int, time.Duration) {}

// gate is a Handler that holds its first batch until opened, then records
// every batch as recorder does.
type gate struct {
	*recorder
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func (g *gate) Handle(ctx context.Context, batches []drain.Batch) []drain.Result {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.open
	}
	return g.recorder.Handle(ctx, batches)
}

// An append to a stream while its cycle holds it notifies nobody (the
// stream is leased); the claim made with that cycle's ack takes it again.
// The poll interval is an hour on a clock that does not move, so only
// that claim can deliver the second event; and once it is delivered, Run
// goes idle without another claim: two claims per cycle (the one the
// append woke, and the one made with the ack), none claimed twice.
func TestRunTakesAppendsMadeWhileLeasedWithTheAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := &gate{recorder: newRecorder(nil), entered: make(chan struct{}), open: make(chan struct{})}
	obs := &claimCounter{}
	const poll = time.Hour
	clock := newWaitClock()
	d := b.drain(t, g, drain.Config{PollInterval: poll, Clock: clock, Notifier: b.store, Observer: obs})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Equal(t, poll, clock.next(t), "nothing to claim: Run waits")
	before := obs.claims.Load()
	b.appendN(t, "leased-1", 1)
	<-g.entered // the first event's cycle holds the stream
	b.appendN(t, "leased-1", 1)
	require.NotEmpty(t, b.info(t, "leased-1").LeasedBy, "the stream is still held")
	close(g.open)

	require.Equal(t, poll, clock.next(t), "both events delivered, Run waits again")
	require.Equal(t, []int64{0, 1}, g.versions("leased-1"), "each event once, in order")
	require.Equal(t, int64(3), obs.claims.Load()-before,
		"claims: the one the append woke, the one with the first ack (it took the stream again), the one with the second ack")
	require.Equal(t, int64(2), obs.streams.Load(), "the stream was claimed twice, once for each event")
	info := b.info(t, "leased-1")
	require.Equal(t, int64(1), info.Watermark)
	require.Empty(t, info.LeasedBy)
}

// Two Runs on one store, appends to a few streams (a writer each) while
// they drain: every event is handed over exactly once and in order
// per stream, with the poll interval an hour (only notifications and the
// claims made with acks deliver), and no stream is in two handlers at
// once.
func TestTwoRunsClaimWithAcksNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("appends for a few seconds")
	}
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	inHand := map[string]bool{}
	twice := atomic.Bool{}
	rec := newRecorder(nil)
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		mu.Lock()
		for _, bt := range batches {
			if inHand[bt.Stream] {
				twice.Store(true)
			}
			inHand[bt.Stream] = true
		}
		mu.Unlock()
		out := rec.Handle(ctx, batches)
		mu.Lock()
		for _, bt := range batches {
			inHand[bt.Stream] = false
		}
		mu.Unlock()
		return out
	})
	ctx, cancel := context.WithCancel(b.ctx)
	var runs sync.WaitGroup
	for i := range 2 {
		d := b.drain(t, h, drain.Config{Owner: fmt.Sprintf("run-%d", i), PollInterval: time.Hour, Notifier: b.store})
		runs.Add(1)
		go func() { defer runs.Done(); _ = d.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); runs.Wait() })

	const writers, perWriter = 4, 100
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			var err error
			for range perWriter {
				if _, err = b.store.Append(b.ctx, fmt.Sprintf("busy-%d", i), store.AnyVersion, store.NewEvent{Name: "Happened", Data: []byte(`{}`)}); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range writers {
		require.NoError(t, <-errs)
	}
	require.Eventually(t, func() bool { return rec.count() == writers*perWriter }, 30*time.Second, 10*time.Millisecond)
	require.False(t, twice.Load(), "a stream was in two handlers at once")
	for i := range writers {
		vs := rec.versions(fmt.Sprintf("busy-%d", i))
		require.Len(t, vs, perWriter)
		for k, v := range vs {
			require.Equal(t, int64(k), v, "stream busy-%d handed over in order, each version once", i)
		}
	}
}
