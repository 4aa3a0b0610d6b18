package deliver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// startBundle publishes events as the bridge does, with ids 1, 2, ... in
// publish order, and runs consumers that start somewhere.
type startBundle struct {
	*orderedBundle
	rc       *startReceiver
	versions map[string]int64 // next version per stream
}

// startReceiver records the event ids it was sent, answering 200.
type startReceiver struct {
	mu  sync.Mutex
	ids map[int64]int
	url string
}

func newStartBundle(t *testing.T) *startBundle {
	b := &startBundle{orderedBundle: setupOrdered(t), rc: &startReceiver{ids: map[int64]int{}}, versions: map[string]int64{}}
	srv := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.Header.Get(wire.HeaderIdempotencyKey), 10, 64)
		if err == nil {
			b.rc.mu.Lock()
			b.rc.ids[id]++
			b.rc.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	})
	b.rc.url = srv.URL
	return b
}

// received returns the event ids delivered, sorted.
func (rc *startReceiver) received() []int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var ids []int64
	for id := range rc.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// publishMany publishes n events over streams order-0..order-<streams-1>,
// asynchronously, and waits for every ack.
func (b *startBundle) publishMany(t *testing.T, n, streams int) {
	t.Helper()
	b.mu.Lock()
	for i := range n {
		stream := fmt.Sprintf("order-%d", i%streams)
		id := b.nextID
		b.nextID++
		v := b.versions[stream]
		b.versions[stream] = v + 1
		b.events[event.FormatID(id)] = orderedEvent{stream, v}
		e := event.Event{ID: id, Stream: stream, Version: v, Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
		_, err := b.js.PublishMsgAsync(forward.Message(e, forward.Config{}))
		require.NoError(t, err)
		if (i+1)%1000 == 0 || i == n-1 { // below the client's limit of outstanding publishes
			select {
			case <-b.js.PublishAsyncComplete():
			case <-b.ctx.Done():
				t.Fatal("publishes not acked")
			}
		}
	}
	b.mu.Unlock()
}

// start provisions a consumer of s (retrying while the copy catches up
// with the start), runs it and stops it at cleanup.
func (b *startBundle) start(t *testing.T, s subscription.Subscription) {
	t.Helper()
	c, err := deliver.New(b.js, deliver.Config{Partitions: 4, LeaseTTL: time.Second,
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}, s)
	require.NoError(t, err)
	var last error
	require.Eventually(t, func() bool { last = c.Provision(b.ctx); return last == nil }, 20*time.Second, 20*time.Millisecond,
		"provision: %v", func() error { return last }())
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// durables returns the durable consumers of s: its one on EVENTS, or its
// partition consumers on the copy.
func (b *startBundle) durables(t *testing.T, s subscription.Subscription) []jetstream.Consumer {
	t.Helper()
	if s.Ordering == subscription.OrderingNone {
		c, err := b.js.Consumer(b.ctx, "EVENTS", s.Name)
		require.NoError(t, err)
		return []jetstream.Consumer{c}
	}
	var out []jetstream.Consumer
	for p := range 4 {
		c, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(s.Name, p))
		require.NoError(t, err)
		out = append(out, c)
	}
	return out
}

// requireDelivered waits for exactly the ids want (sorted) to be delivered
// and the durables to have nothing more to deliver.
func (b *startBundle) requireDelivered(t *testing.T, s subscription.Subscription, want []int64) {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.rc.received()) >= len(want) }, 30*time.Second, 10*time.Millisecond,
		"want %d deliveries", len(want))
	require.Eventually(t, func() bool {
		for _, c := range b.durables(t, s) {
			info, err := c.Info(b.ctx)
			if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every durable settled")
	require.Equal(t, want, b.rc.received())
}

func ids(from, to int64) []int64 {
	var out []int64
	for id := from; id <= to; id++ {
		out = append(out, id)
	}
	return out
}

func startSub(name, url string, ordering subscription.Ordering, start subscription.Start) subscription.Subscription {
	s := orderedSub(name, url)
	s.Ordering, s.Start = ordering, start
	return s
}

var orderings = []subscription.Ordering{subscription.OrderingNone, subscription.OrderingStream}

// A new subscription on a stream with 10,000 old events gets only the
// events stored after its durable consumers were created.
func TestStartNewDeliversOnlyEventsStoredAfterCreation(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 10,000 events twice")
	}
	t.Parallel()
	for _, ordering := range orderings {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			b := newStartBundle(t)
			b.publishMany(t, 10_000, 100)
			s := startSub("fresh", b.rc.url, ordering, subscription.Start{}) // the zero value: new
			b.start(t, s)
			b.publishMany(t, 50, 100)
			b.requireDelivered(t, s, ids(10_001, 10_050))
			for _, c := range b.durables(t, s) {
				require.Equal(t, "new", c.CachedInfo().Config.Metadata[subscription.StartMetadataKey])
			}
		})
	}
}

// time: and sequence: start where they say, for ordered subscriptions too,
// whose copy's sequences are not the events stream's: the events stream
// here begins at sequence 6 (5 events purged before the copy existed),
// the copy at 1.
func TestStartAtTimeAndSequence(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four JetStream servers")
	}
	t.Parallel()
	for _, ordering := range orderings {
		for _, kind := range []subscription.StartPolicy{subscription.StartTime, subscription.StartSequence} {
			t.Run(string(ordering)+"/"+string(kind), func(t *testing.T) {
				t.Parallel()
				b := newStartBundle(t)
				b.publishMany(t, 5, 3)
				events, err := b.js.Stream(b.ctx, "EVENTS")
				require.NoError(t, err)
				require.NoError(t, events.Purge(b.ctx))
				b.publishMany(t, 10, 3) // ids 6..15 at sequences 6..15
				tenth, err := events.GetMsg(b.ctx, 15)
				require.NoError(t, err)
				require.Eventually(t, func() bool { return time.Now().After(tenth.Time) }, time.Second, time.Millisecond)
				at := time.Now()
				b.publishMany(t, 10, 3) // ids 16..25 at sequences 16..25, stored after at

				start, want := subscription.StartAtTime(at), ids(16, 25)
				if kind == subscription.StartSequence {
					start, want = subscription.StartAtSequence(12), ids(12, 25)
				}
				s := startSub("from", b.rc.url, ordering, start)
				b.start(t, s)
				b.publishMany(t, 3, 3) // and what comes after
				b.requireDelivered(t, s, append(want, 26, 27, 28))
			})
		}
	}
}

// A start that differs from the one the durable was created with is
// refused, saying how to reset; a durable created before starts were
// recorded is accepted as it is.
func TestStartChangedIsRefusedWithHowToReset(t *testing.T) {
	if testing.Short() {
		t.Skip("starts JetStream servers")
	}
	t.Parallel()
	for _, ordering := range orderings {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			b := newStartBundle(t)
			b.publishMany(t, 3, 1)
			provision := func(s subscription.Subscription) error {
				c, err := deliver.New(b.js, deliver.Config{Partitions: 4}, s)
				require.NoError(t, err)
				var err2 error
				require.Eventually(t, func() bool {
					err2 = c.Provision(b.ctx)
					return err2 == nil || !strings.Contains(err2.Error(), "waiting")
				}, 10*time.Second, 20*time.Millisecond)
				return err2
			}
			require.NoError(t, provision(startSub("sub", b.rc.url, ordering, subscription.Start{Policy: subscription.StartAll})))
			require.NoError(t, provision(startSub("sub", b.rc.url, ordering, subscription.Start{Policy: subscription.StartAll})), "the same start again")
			err := provision(startSub("sub", b.rc.url, ordering, subscription.StartAtSequence(2)))
			require.ErrorIs(t, err, subscription.ErrStartChanged)
			require.ErrorContains(t, err, `start "sequence:2"`)
			require.ErrorContains(t, err, `created with start "all"`)
			if ordering == subscription.OrderingNone {
				require.ErrorContains(t, err, "nats consumer rm EVENTS sub")
			} else {
				require.ErrorContains(t, err, "for p in $(seq 0 3); do nats consumer rm -f EVENTS_ORDERED sub_p$p; done")
			}
		})
	}
	t.Run("not recorded", func(t *testing.T) {
		t.Parallel()
		b := newStartBundle(t)
		b.publishMany(t, 3, 1)
		_, err := b.js.CreateConsumer(b.ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "old", AckPolicy: jetstream.AckExplicitPolicy})
		require.NoError(t, err)
		s := startSub("old", b.rc.url, subscription.OrderingNone, subscription.Start{})
		b.start(t, s)
		b.requireDelivered(t, s, ids(1, 3))
		info := b.durables(t, s)[0].CachedInfo().Config
		require.Equal(t, "all (not recorded)", subscription.ReportedStart(info))
	})
}
