package deliver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// orderedEvent is one event an ordered test published.
type orderedEvent struct {
	stream  string
	version int64
}

// orderedBundle publishes events as the bridge does and remembers each
// event id's stream and version.
type orderedBundle struct {
	bundle
	mu     sync.Mutex
	events map[string]orderedEvent
	nextID int64
}

func setupOrdered(t *testing.T) *orderedBundle {
	return &orderedBundle{bundle: setup(t), events: map[string]orderedEvent{}, nextID: 1}
}

// publishStream publishes versions from..to-1 of stream, named
// OrderNoted.
func (b *orderedBundle) publishStream(t *testing.T, stream string, from, to int64) {
	t.Helper()
	for v := from; v < to; v++ {
		b.publish(t, stream, v, "OrderNoted")
	}
}

// publish publishes version v of stream with event name name.
func (b *orderedBundle) publish(t *testing.T, stream string, v int64, name string) {
	t.Helper()
	b.mu.Lock()
	id := b.nextID
	b.nextID++
	b.events[event.FormatID(id)] = orderedEvent{stream, v}
	b.mu.Unlock()
	e := event.Event{ID: id, Stream: stream, Version: v, Name: name, Data: []byte(`{}`), Created: time.Now()}
	_, err := b.js.PublishMsg(b.ctx, forward.Message(e, forward.Config{}))
	require.NoError(t, err)
}

func (b *orderedBundle) event(id string) orderedEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events[id]
}

// orderedReceiver records each request's event, replica and time and
// answers with respond.
type orderedReceiver struct {
	*httptest.Server
	b       *orderedBundle
	mu      sync.Mutex
	got     []delivery
	respond func(e orderedEvent, attempt int) int
	tries   map[string]int
}

type delivery struct {
	e       orderedEvent
	id      string
	replica string
	status  int
	at      time.Time
}

func newOrderedReceiver(t *testing.T, b *orderedBundle, respond func(e orderedEvent, attempt int) int) *orderedReceiver {
	rc := &orderedReceiver{b: b, respond: respond, tries: map[string]int{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		e := b.event(id)
		rc.mu.Lock()
		rc.tries[id]++
		n := rc.tries[id]
		respond := rc.respond
		rc.mu.Unlock()
		code := respond(e, n)
		rc.mu.Lock()
		rc.got = append(rc.got, delivery{e: e, id: id, replica: r.Header.Get(wire.HeaderReplica), status: code, at: time.Now()})
		rc.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *orderedReceiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

// accepted returns, per stream, the versions answered 2xx in arrival order.
func (rc *orderedReceiver) accepted() map[string][]int64 {
	out := map[string][]int64{}
	for _, d := range rc.deliveries() {
		if d.status/100 == 2 {
			out[d.e.stream] = append(out[d.e.stream], d.e.version)
		}
	}
	return out
}

func orderedSub(name, url string) subscription.Subscription {
	s := sub(name, url)
	s.Ordering = subscription.OrderingStream
	s.AckWait = 3 * time.Second
	s.Timeout = 1400 * time.Millisecond
	return s
}

// runOrdered starts an ordered consumer and stops it at cleanup.
func (b *orderedBundle) runOrdered(t *testing.T, cfg deliver.Config, subs ...subscription.Subscription) *deliver.Consumer {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	c, err := deliver.New(b.js, cfg, subs...)
	require.NoError(t, err)
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
	return c
}

// requireInOrder fails unless every stream's versions were first
// accepted in order 0..n-1. A version accepted again (at least once: a
// replica whose lease deadline passed under load acks nothing, so what it
// POSTed is redelivered) is logged, not failed: it was accepted before,
// and a receiver drops it by its Idempotency-Key.
func requireInOrder(t *testing.T, acc map[string][]int64, streams []string, n int64) {
	t.Helper()
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i)
	}
	for _, s := range streams {
		var first []int64
		seen := map[int64]bool{}
		for _, v := range acc[s] {
			if seen[v] {
				t.Logf("stream %s: version %d accepted again (at least once)", s, v)
				continue
			}
			seen[v] = true
			first = append(first, v)
		}
		require.Equal(t, want, first, "stream %s: versions in the order first accepted (all accepted: %v)", s, acc[s])
	}
}

func TestOrderedTwoConsumersSplitPartitionsAndKeepOrder(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if attempt == 1 && (e.version*7+int64(len(e.stream)))%10 == 0 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	s := orderedSub("two", rc.URL)
	s.BackOff = []time.Duration{20 * time.Millisecond}
	// 10 % first attempts fail: keep the breakers closed.
	lenient := func() *breaker.Set {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1_000_000, MinRequests: 1_000_000}, nil, nil)
		require.NoError(t, err)
		return set
	}
	b.runOrdered(t, deliver.Config{ReplicaID: "one", Breakers: lenient()}, s)
	b.runOrdered(t, deliver.Config{ReplicaID: "two", Breakers: lenient()}, s)
	var streams []string
	for i := range 30 {
		streams = append(streams, fmt.Sprintf("order-%d", i))
	}
	for v := int64(0); v < 10; v++ {
		for _, st := range streams {
			b.publishStream(t, st, v, v+1)
		}
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, vs := range rc.accepted() {
			n += len(slices.Compact(slices.Sorted(slices.Values(vs))))
		}
		return n >= 300
	}, 30*time.Second, 20*time.Millisecond, "every version of every stream accepted")
	requireInOrder(t, rc.accepted(), streams, 10)
	replicas := map[string]bool{}
	for _, d := range rc.deliveries() {
		replicas[d.replica] = true
	}
	require.Len(t, replicas, 2, "both replicas delivered: %v", replicas)

	kv, err := b.js.KeyValue(b.ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	owners := map[string]int{}
	for p := range 4 {
		e, err := kv.Get(b.ctx, wire.LeaseKey("two", p))
		require.NoError(t, err)
		owners[string(e.Value())]++
	}
	require.Equal(t, map[string]int{"one": 2, "two": 2}, owners)
	_ = jetstream.KeyValuePut
}

// tWriter sends a consumer's log lines to the test's log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A subscription that ran unordered and switches to ordered delivery does
// not get what its unordered durable consumer acknowledged again: its
// partition consumers start after that consumer's ack floor.
func TestOrderedSwitchStartsAfterTheUnorderedAckFloor(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusOK })
	s := orderedSub("switch", rc.URL)
	s.Ordering = subscription.OrderingNone
	b.publishStream(t, "order-1", 0, 10)
	c, err := deliver.New(b.js, deliver.Config{}, s)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 10 }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		cons, err := b.js.Consumer(b.ctx, "EVENTS", "switch")
		if err != nil {
			return false
		}
		info, err := cons.Info(b.ctx)
		return err == nil && info.AckFloor.Stream == 10
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	b.publishStream(t, "order-1", 10, 15)
	s.Ordering = subscription.OrderingStream
	b.runOrdered(t, deliver.Config{}, s)
	require.Eventually(t, func() bool { return len(rc.deliveries()) >= 15 }, 20*time.Second, 10*time.Millisecond)
	// Every partition consumer settled: nothing more is coming.
	require.Eventually(t, func() bool {
		for p := range 4 {
			cons, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable("switch", p))
			if err != nil {
				return false
			}
			info, err := cons.Info(b.ctx)
			if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
	before := 0
	for _, d := range rc.deliveries() {
		if d.e.version < 10 {
			before++
		}
	}
	require.Equal(t, 10, before, "versions 0-9 were not sent again")
	// Unordered, versions 0-9 went out in parallel (any order); ordered,
	// 10-14 follow them in order.
	acc := rc.accepted()["order-1"]
	require.Len(t, acc, 15)
	require.ElementsMatch(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, acc[:10])
	require.Equal(t, []int64{10, 11, 12, 13, 14}, acc[10:])
}

// A lease bucket created with another TTL (an earlier run, a replica with
// another lease TTL) keeps it: its keys expire after it. A replica goes by
// the bucket's TTL, and says so, instead of renewing on its own: told 8 s,
// it would renew every 2 s keys that expire after 1 s, and lose them.
func TestOrderedUsesTheLeaseBucketsTTL(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	kv, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultLeaseBucket, TTL: time.Second, History: 1})
	require.NoError(t, err)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusNoContent })
	logs := &syncLog{}
	b.runOrdered(t, deliver.Config{LeaseTTL: 8 * time.Second, Partitions: 2,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}, orderedSub("ttl", rc.URL))
	b.publishStream(t, "order-1", 0, 5)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 5 }, 20*time.Second, 10*time.Millisecond)

	// Partition 0's lease is renewed 4 times (each renewal writes its
	// key: a new revision), and never lost meanwhile.
	key := wire.LeaseKey("ttl", 0)
	revisions := map[uint64]bool{}
	require.Eventually(t, func() bool {
		if e, err := kv.Get(b.ctx, key); err == nil {
			revisions[e.Revision()] = true
		}
		return len(revisions) >= 5
	}, 30*time.Second, 10*time.Millisecond, "partition 0's lease renewed")
	require.NotContains(t, logs.String(), "partition lease lost")
	require.Contains(t, logs.String(), "the lease bucket's TTL is not the configured lease TTL")
	require.Contains(t, logs.String(), "bucket_ttl=1s lease_ttl=8s")
}

// An events stream deleted and created again under an existing
// partitioned copy: the copy would source from its old sequence on and
// skip the new stream's messages up to there. Provision refuses, saying
// what to delete.
func TestOrderedProvisionRefusesACopyOfARecreatedEventsStream(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	s := orderedSub("recreated", "http://127.0.0.1:1")
	b.publishStream(t, "order-1", 0, 5)
	c, err := deliver.New(b.js, deliver.Config{Partitions: 4}, s)
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	require.Eventually(t, func() bool {
		st, err := b.js.Stream(b.ctx, wire.OrderedStream("EVENTS"))
		return err == nil && st.CachedInfo().State.Msgs == 5
	}, 10*time.Second, 10*time.Millisecond, "the copy sourced the 5 events")
	// Provisioning again over the same events stream is fine.
	c, err = deliver.New(b.js, deliver.Config{Partitions: 4}, s)
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))

	require.NoError(t, b.js.DeleteStream(b.ctx, "EVENTS"))
	_, err = b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	b.publishStream(t, "order-2", 0, 2)
	c, err = deliver.New(b.js, deliver.Config{Partitions: 4}, s)
	require.NoError(t, err)
	err = c.Provision(b.ctx)
	require.ErrorIs(t, err, ordercopy.ErrEventsRecreated)
	require.ErrorContains(t, err, `JetStream stream "EVENTS_ORDERED" holds messages of "EVENTS" up to its sequence 5, and "EVENTS" ends at 2`)
	require.ErrorContains(t, err, "nats stream rm EVENTS_ORDERED")
}
