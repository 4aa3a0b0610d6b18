package consumer_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// orderReceiver is a real endpoint verifying every request's signature
// and recording, per path (one per subscription), the event ids
// received and, per stream, the versions in the order they came.
type orderReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	ids      map[string]map[string]bool
	versions map[string]map[string][]int64 // path → stream → versions received
	bad      int
}

func newOrderReceiver(t *testing.T) *orderReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	rc := &orderReceiver{ids: map[string]map[string]bool{}, versions: map[string]map[string][]int64{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if err := v.Verify(r.Header, body); err != nil {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		path := r.URL.Path
		if rc.ids[path] == nil {
			rc.ids[path], rc.versions[path] = map[string]bool{}, map[string][]int64{}
		}
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		if !rc.ids[path][id] {
			rc.ids[path][id] = true
			stream, _ := wire.DecodeHeaderValue(r.Header.Get(wire.HeaderSubject))
			ver, _ := strconv.ParseInt(r.Header.Get(wire.HeaderStreamVersion), 10, 64)
			rc.versions[path][stream] = append(rc.versions[path][stream], ver)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *orderReceiver) received(path string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.ids[path])
}

// inOrder reports the streams of path whose versions came out of order.
func (rc *orderReceiver) inOrder(path string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var bad []string
	for stream, vs := range rc.versions[path] {
		for i := 1; i < len(vs); i++ {
			if vs[i] != vs[i-1]+1 {
				bad = append(bad, fmt.Sprintf("%s: %v", stream, vs))
				break
			}
		}
	}
	return bad
}

// publishN publishes n events as the bridge does (forward.Message),
// round robin over streams streams, from event id first.
func (b bundle) publishN(t *testing.T, first, n, streams int) {
	t.Helper()
	for k := first; k < first+n; k++ {
		e := event.Event{ID: int64(k + 1), Stream: fmt.Sprintf("order-%d", k%streams), Version: int64(k / streams),
			Name: "Placed", Data: []byte(`{}`), Created: time.Now()}
		_, err := b.js.PublishMsg(b.ctx, forward.Message(e, forward.Config{}))
		require.NoError(t, err)
	}
}

func sharedSub(name, url string, ordering consumer.Ordering) consumer.Subscription {
	s := sub(name, url+"/"+name)
	s.Ordering, s.Body = ordering, consumer.BodyBinary
	return s
}

// A Consumer delivers an ordered and an unordered
// subscription through the shared engine: every event to each, signed,
// the ordered one each stream in version order; its metrics are on the
// Consumer's Registerer.
func TestSharedEngineDeliversOrderedAndUnordered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	rc := newOrderReceiver(t)
	reg := prometheus.NewRegistry()
	c, err := consumer.New(b.js, consumer.Config{Registerer: reg, Partitions: 4,
		LeaseTTL: 2 * time.Second, ReplicaID: "replica-a",
		Subscriptions: []consumer.Subscription{sharedSub("ordered", rc.srv.URL, consumer.OrderingStream),
			sharedSub("unordered", rc.srv.URL, consumer.OrderingNone)}})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	require.Eventually(t, func() bool { return c.Ready(b.ctx) == nil }, 10*time.Second, 10*time.Millisecond)

	const n = 200
	b.publishN(t, 0, n, 10)
	require.Eventually(t, func() bool { return rc.received("/ordered") == n && rc.received("/unordered") == n },
		30*time.Second, 10*time.Millisecond, "every event to each subscription")
	require.Empty(t, rc.inOrder("/ordered"), "the ordered subscription's streams in version order")
	require.Zero(t, rc.bad, "requests whose signature did not verify")

	require.Equal(t, 4.0, promregtest.Value(t, reg, "jsbridge_consumer_shared_partitions_owned"), "one replica owns every partition")
	// Counted once the POST returned, after the receiver recorded it.
	require.Eventually(t, func() bool {
		return promregtest.Value(t, reg, "jsbridge_consumer_deliveries_total", "subscription", "ordered", "outcome", "ack") == n
	}, 5*time.Second, 10*time.Millisecond, "every ordered delivery counted")
	require.Equal(t, 4.0, promregtest.Value(t, reg, "jsbridge_consumer_shared_handovers_total", "direction", "gained", "cause", "claimed"))
	require.Positive(t, promregtest.Value(t, reg, "jsbridge_consumer_position_commits_total", "key", "record", "result", "ok"))

	require.NoError(t, c.Stop(b.ctx))
	require.Equal(t, 4.0, promregtest.Value(t, reg, "jsbridge_consumer_shared_handovers_total", "direction", "released", "cause", "stopping"),
		"a graceful stop releases every partition")
}

// The shared engine refuses at once, naming the fix, an events stream
// without AllowDirect and the durables engine's layout not migrated;
// once migrated (the positions bucket's "migrated" key) it provisions.
func TestSharedEngineProvisionRefusals(t *testing.T) {
	t.Parallel()
	rc := newOrderReceiver(t)
	shared := func(t *testing.T, js jetstream.JetStream) *consumer.Consumer {
		c, err := consumer.New(js, consumer.Config{
			Subscriptions: []consumer.Subscription{sharedSub("orders", rc.srv.URL, consumer.OrderingNone)}})
		require.NoError(t, err)
		return c
	}

	t.Run("no AllowDirect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Created by an earlier release: without AllowDirect.
		_, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
		require.NoError(t, err)
		err = shared(t, b.js).Provision(b.ctx)
		require.ErrorIs(t, err, consumer.ErrNoAllowDirect)
		require.ErrorContains(t, err, "consumer migrate")
		require.ErrorContains(t, err, "nats stream edit EVENTS --allow-direct")
		require.NoError(t, b.ctx.Err(), "refused at once, not waited for")
	})

	t.Run("durables not migrated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.createEvents(t)
		// The durables engine of an earlier release ran here: its durable
		// consumer is on EVENTS, described as it described them.
		_, err := b.js.CreateConsumer(b.ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "orders",
			Description: "jsbridge webhook subscription to " + rc.srv.URL, AckPolicy: jetstream.AckExplicitPolicy})
		require.NoError(t, err)

		err = shared(t, b.js).Provision(b.ctx)
		require.ErrorIs(t, err, consumer.ErrNotMigrated)
		require.ErrorContains(t, err, "run `consumer migrate`")
		require.ErrorContains(t, err, `docs/operations.md, "Upgrading from a release that ran the durables engine"`)
		require.ErrorContains(t, err, `"orders"`)

		kv, err := position.Bucket(b.ctx, b.js, "", 1)
		require.NoError(t, err)
		_, err = kv.PutString(b.ctx, mark.DoneKey, "fingerprint")
		require.NoError(t, err)
		require.NoError(t, shared(t, b.js).Provision(b.ctx), "migrated: the old layout is left for --cleanup")
	})
}

// A subscription of the Config with start new begins, under the shared
// engine, after the events stored when the consumer provisioned, as the
// durables engine's durable consumers made at Provision do: the events
// stored between Provision and Run are delivered, those before are not.
func TestSharedEngineStartNewResolvesAtProvision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	rc := newOrderReceiver(t)
	s := sharedSub("fresh", rc.srv.URL, consumer.OrderingStream)
	s.Start = consumer.Start{Policy: consumer.StartNew}
	c, err := consumer.New(b.js, consumer.Config{Partitions: 4, LeaseTTL: 2 * time.Second,
		ReplicaID: "replica-a", Subscriptions: []consumer.Subscription{s}})
	require.NoError(t, err)

	b.publishN(t, 0, 20, 5) // before Provision: not its
	require.NoError(t, c.Provision(b.ctx))
	b.publishN(t, 20, 20, 5) // between Provision and Run: its
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	require.Eventually(t, func() bool { return c.Ready(b.ctx) == nil }, 10*time.Second, 10*time.Millisecond)
	b.publishN(t, 40, 20, 5)

	require.Eventually(t, func() bool { return rc.received("/fresh") == 40 }, 30*time.Second, 10*time.Millisecond,
		"the 40 events stored from Provision on (has %d)", rc.received("/fresh"))
	rc.mu.Lock()
	for k := range 60 {
		id := event.FormatID(int64(k + 1))
		require.Equal(t, k >= 20, rc.ids["/fresh"][id], "event %s", id)
	}
	rc.mu.Unlock()
	require.Empty(t, rc.inOrder("/fresh"))
	require.Zero(t, rc.bad)
}
