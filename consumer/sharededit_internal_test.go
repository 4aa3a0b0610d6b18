package consumer

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/wire"
)

// countingEndpoint counts the distinct Idempotency-Keys each path (one
// per subscription) received.
type countingEndpoint struct {
	srv *httptest.Server

	mu  sync.Mutex
	ids map[string]map[string]bool
}

func newCountingEndpoint(t *testing.T) *countingEndpoint {
	e := &countingEndpoint{ids: map[string]map[string]bool{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		if e.ids[r.URL.Path] == nil {
			e.ids[r.URL.Path] = map[string]bool{}
		}
		e.ids[r.URL.Path][r.Header.Get(wire.HeaderIdempotencyKey)] = true
		e.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *countingEndpoint) received(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ids[path])
}

// A subscription put, paused, resumed and removed through the
// subscriptions bucket while two replicas of the shared engine run:
// each change is applied on both within a second, and delivery follows
// (nothing while paused, everything held back once resumed, nothing
// after the removal, whose cursors are deleted); subscriptions added
// later start where their start says.
func TestSharedEngineAppliesTheBucketsChangesOnEveryReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	connect := func() jetstream.JetStream {
		nc, err := srv.Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	js := connect()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	key, err := GenerateSecretsKey("k1")
	require.NoError(t, err)
	ring, err := ParseSecretsKeyring(key)
	require.NoError(t, err)
	store, err := OpenSubscriptionStore(ctx, js, SubscriptionStoreConfig{Keys: ring})
	require.NoError(t, err)

	var replicas []*shared.Replica
	for _, id := range []string{"replica-a", "replica-b"} {
		rjs := connect()
		rstore, err := OpenSubscriptionStore(ctx, rjs, SubscriptionStoreConfig{Keys: ring})
		require.NoError(t, err)
		c, err := New(rjs, Config{SubscriptionStore: rstore, ReplicaID: id, Partitions: 4,
			LeaseTTL: 2 * time.Second, Logger: testLogger(id)})
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
		replicas = append(replicas, c.engine.r)
	}
	// seen waits, at most a second from now, until cond holds on both
	// replicas, and says how long it took.
	seen := func(what string, cond func(r *shared.Replica) bool) {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool { return cond(replicas[0]) && cond(replicas[1]) }, time.Second, 5*time.Millisecond,
			"%s on both replicas within 1 s", what)
		t.Logf("%s on both replicas in %s", what, time.Since(start).Round(time.Millisecond))
	}

	ep := newCountingEndpoint(t)
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("consumer-edit-secret-0123456789"))
	mk := func(name string, ordering Ordering) Subscription {
		return Subscription{Name: name, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: ep.srv.URL + "/" + name,
			Secrets: []string{secret}, AllowPrivate: true, Ordering: ordering, BackOff: []time.Duration{50 * time.Millisecond}}
	}
	published := 0
	publish := func(n int) {
		t.Helper()
		for range n {
			k := published
			e := event.Event{ID: int64(k + 1), Stream: fmt.Sprintf("order-%d", k%8), Version: int64(k / 8), Name: "Placed",
				Data: []byte(`{}`), Created: time.Now()}
			_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
			require.NoError(t, err)
			published++
		}
	}
	delivered := func(path string, n int) {
		t.Helper()
		require.Eventually(t, func() bool { return ep.received(path) == n }, 20*time.Second, 10*time.Millisecond,
			"%s receives %d events (has %d)", path, n, ep.received(path))
	}

	// audit runs throughout: once it has an event, every replica has
	// dispatched it.
	_, err = store.Create(ctx, mk("audit", OrderingNone), false)
	require.NoError(t, err)
	seen("audit put", func(r *shared.Replica) bool { return slices.Contains(r.Names(), "audit") })

	_, err = store.Create(ctx, mk("orders", OrderingStream), false)
	require.NoError(t, err)
	seen("orders put", func(r *shared.Replica) bool { return slices.Contains(r.Names(), "orders") })
	publish(40)
	delivered("/audit", 40)
	delivered("/orders", 40)

	_, err = store.SetPaused(ctx, "orders", true, 0)
	require.NoError(t, err)
	seen("orders paused", func(r *shared.Replica) bool { return r.Paused("orders") })
	publish(40)
	delivered("/audit", 80)
	require.Equal(t, 40, ep.received("/orders"), "nothing sent to a paused subscription")

	_, err = store.SetPaused(ctx, "orders", false, 0)
	require.NoError(t, err)
	seen("orders resumed", func(r *shared.Replica) bool { return !r.Paused("orders") && slices.Contains(r.Names(), "orders") })
	delivered("/orders", 80) // what it missed while paused, read by its cursors

	got, err := store.Get(ctx, "orders")
	require.NoError(t, err)
	require.NoError(t, store.Delete(ctx, "orders", got.Revision))
	seen("orders removed", func(r *shared.Replica) bool { return !slices.Contains(r.Names(), "orders") })
	publish(20)
	delivered("/audit", 100)
	require.Equal(t, 80, ep.received("/orders"), "nothing sent to a removed subscription")
	// Start positions: a subscription put now with start all reads every
	// event stored so far through its cursors, one with start new
	// (its document's creation time) only what comes after.
	all := mk("from-all", OrderingStream)
	all.Start = Start{Policy: StartAll}
	_, err = store.Create(ctx, all, false)
	require.NoError(t, err)
	_, err = store.Create(ctx, mk("from-new", OrderingNone), false)
	require.NoError(t, err)
	seen("from-all and from-new put", func(r *shared.Replica) bool {
		return slices.Contains(r.Names(), "from-all") && slices.Contains(r.Names(), "from-new")
	})
	delivered("/from-all", published)
	publish(10)
	delivered("/from-all", published)
	delivered("/from-new", 10)

	kv, err := js.KeyValue(ctx, position.DefaultBucket)
	require.NoError(t, err)
	keys, err := kv.ListKeys(ctx)
	require.NoError(t, err)
	for k := range keys.Keys() {
		require.False(t, strings.HasPrefix(k, "cur.orders."), "a removed subscription's cursor key %s", k)
	}
}

// testLogger logs to stderr under -v, else discards.
func testLogger(id string) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", id)
	}
	return slog.New(slog.DiscardHandler)
}
