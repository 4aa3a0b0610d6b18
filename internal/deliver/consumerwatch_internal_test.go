package deliver

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// countedInfoConsumer answers Info with its current info and counts the calls.
type countedInfoConsumer struct {
	jetstream.Consumer
	mu    sync.Mutex
	info  jetstream.ConsumerInfo
	calls int
}

func (c *countedInfoConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	info := c.info
	return &info, nil
}

func (c *countedInfoConsumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// A quiet partition (nothing pending on its consumer, nothing pulled
// since the last read) reads its consumer every quietReads ticks, not
// every tick; one that pulled a message, or whose consumer has something
// pending, reads it at the next tick.
func TestConsumerWatchReadsAQuietPartitionSeldom(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	clock := clockwork.NewFakeClock()
	cons := &countedInfoConsumer{}
	cw := &consumerWatch{cons: cons, every: time.Second, clock: clock, log: slog.New(slog.DiscardHandler),
		copyStream: func(context.Context) (jetstream.Stream, error) { return nil, context.Canceled }, release: func() {}}
	done := make(chan struct{})
	go func() { defer close(done); cw.watchConsumer(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// tick moves the clock one period once the watch waits on it.
	tick := func() {
		t.Helper()
		require.NoError(t, clock.BlockUntilContext(ctx, 1))
		clock.Advance(time.Second)
	}
	require.Eventually(t, func() bool { return cons.count() == 1 }, 5*time.Second, time.Millisecond, "the first read")
	for range quietReads - 1 {
		tick()
	}
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Equal(t, 1, cons.count(), "quiet: no read for quietReads-1 ticks")
	tick()
	require.Eventually(t, func() bool { return cons.count() == 2 }, 5*time.Second, time.Millisecond, "the quiet partition's periodic read")

	cw.pulled.Add(1)
	tick()
	require.Eventually(t, func() bool { return cons.count() == 3 }, 5*time.Second, time.Millisecond, "a message pulled: read at the next tick")

	cons.mu.Lock()
	cons.info.NumAckPending = 1
	cons.mu.Unlock()
	tick()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Equal(t, 3, cons.count(), "quiet at the last read: the new pending is seen at the periodic read")
	for range quietReads - 1 {
		tick()
	}
	require.Eventually(t, func() bool { return cons.count() == 4 }, 5*time.Second, time.Millisecond)
	tick()
	require.Eventually(t, func() bool { return cons.count() == 5 }, 5*time.Second, time.Millisecond, "something pending: read every tick")
	tick()
	require.Eventually(t, func() bool { return cons.count() == 6 }, 5*time.Second, time.Millisecond)
}
