// Package integration tests jsbridge across components: a real Postgres
// (jsbridgetest), a real JetStream server (embedded) and real HTTP
// receivers (httptest).
package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

type bundle struct {
	st  *store.Store
	srv *embedded.Server
	js  jetstream.JetStream
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := jsbridgetest.Pool(t)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	b := &bundle{st: st, srv: jsbridgetest.StartJetStream(t, embedded.Config{})}
	b.js = b.connect(t)
	_, err = forward.Provision(ctx, b.js, forward.StreamConfig{})
	require.NoError(t, err)
	return b
}

// connect opens a new client connection, as a separate process would.
func (b *bundle) connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := jsbridgetest.Connect(t, b.srv)
	return js
}

// startBridge runs one bridge (drain + forwarder on its own connection)
// until the test ends.
func (b *bundle) startBridge(t *testing.T, owner string) {
	t.Helper()
	fwd, err := forward.New(b.connect(t), forward.Config{})
	require.NoError(t, err)
	d, err := drain.New(b.st, fwd, drain.Config{
		Owner: owner, Lease: 10 * time.Second, ClaimLimit: 20, FetchLimit: 100,
		PollInterval: 100 * time.Millisecond, Notifier: b.st,
	})
	require.NoError(t, err)
	runUntilCleanup(t, d.Run)
}

// startConsumer runs one consumer replica until the test ends.
func (b *bundle) startConsumer(t *testing.T, subs ...consumer.Subscription) {
	t.Helper()
	c, err := consumer.New(b.connect(t), consumer.Config{Subscriptions: subs})
	require.NoError(t, err)
	runUntilCleanup(t, c.Run)
}

func runUntilCleanup(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("component did not stop within 30s of cancel")
		}
	})
}

// recorder is a receiver built on package webhook: verifies, dedups, records.
type recorder struct {
	mu        sync.Mutex
	processed map[string]int // event id -> times processed
}

func newRecorder(t *testing.T) (*recorder, *httptest.Server) {
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	rc := &recorder{processed: map[string]int{}}
	h := webhook.Handler(v, webhook.NewMemoryStore(100_000), time.Hour, func(_ context.Context, r *http.Request, body []byte) error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.processed[r.Header.Get("Idempotency-Key")]++
		return nil
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *recorder) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.processed)
}

func TestMainJobTwoBridgesTwoConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rc, rsrv := newRecorder(t)
	sub := consumer.Subscription{
		Name: "all", FilterSubjects: []string{"events.>"}, URL: rsrv.URL, Secrets: []string{testSecret},
		Timeout: 4 * time.Second, AckWait: 10 * time.Second, BackOff: []time.Duration{200 * time.Millisecond}, AllowPrivate: true,
		Start: consumer.Start{Policy: consumer.StartAll},
	}
	b.startBridge(t, "bridge-a")
	b.startBridge(t, "bridge-b")
	b.startConsumer(t, sub)
	b.startConsumer(t, sub)

	const streams, perStream = 100, 100
	ids := make(map[int64]bool, streams*perStream)
	var idsMu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := w; s < streams; s += 4 {
				stream := fmt.Sprintf("order-%d", s)
				for v := range perStream {
					evs, err := b.st.Append(ctx, stream, int64(v)-1, store.NewEvent{Name: "OrderNoted", Data: fmt.Appendf(nil, `{"n":%d}`, v)})
					if err != nil {
						t.Errorf("append %s v%d: %v", stream, v, err)
						return
					}
					idsMu.Lock()
					ids[evs[0].ID] = true
					idsMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, ids, streams*perStream)

	require.Eventually(t, func() bool { return rc.count() == streams*perStream }, 2*time.Minute, 100*time.Millisecond,
		"receiver got %d of %d events", rc.count(), streams*perStream)

	// The receiver processed each event exactly once, and only ours.
	rc.mu.Lock()
	for id, n := range rc.processed {
		require.Equal(t, 1, n, "event %s processed %d times", id, n)
		i, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		require.True(t, ids[i], "unknown event id %s", id)
	}
	rc.mu.Unlock()

	// JetStream holds every event once, each stream in version order.
	assertJetStreamOrdered(t, b.js, streams*perStream)
}

// assertJetStreamOrdered reads the whole EVENTS stream and checks that it
// holds want messages, each event id once, and every stream's versions in
// order 0, 1, 2, ...
func assertJetStreamOrdered(t *testing.T, js jetstream.JetStream, want int) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(want), info.State.Msgs, "messages in EVENTS")
	seen := map[string]bool{}
	next := map[string]int64{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		id := m.Header.Get("Nats-Msg-Id")
		require.False(t, seen[id], "event %s stored twice", id)
		seen[id] = true
		stream := m.Header.Get(wire.HeaderSubject)
		v, err := strconv.ParseInt(m.Header.Get(wire.HeaderStreamVersion), 10, 64)
		require.NoError(t, err)
		require.Equal(t, next[stream], v, "stream %s: version %d stored at seq %d, want %d", stream, v, seq, next[stream])
		next[stream] = v + 1
	}
}

func TestMainJobPermanentAndTransientFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	var gone atomic.Int32
	goneSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gone.Add(1)
		w.WriteHeader(http.StatusUnprocessableEntity)
	}))
	t.Cleanup(goneSrv.Close)

	var flakyCalls atomic.Int32
	var flakyOK atomic.Value
	flakySrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if flakyCalls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		flakyOK.Store(r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(flakySrv.Close)

	b.startBridge(t, "bridge")
	b.startConsumer(t,
		consumer.Subscription{Name: "rejecting", FilterSubjects: []string{"events.>"}, URL: goneSrv.URL, Secrets: []string{testSecret},
			Timeout: 2 * time.Second, AckWait: 5 * time.Second, BackOff: []time.Duration{100 * time.Millisecond}, AllowPrivate: true, Ordering: consumer.OrderingNone,
			Start: consumer.Start{Policy: consumer.StartAll}},
		consumer.Subscription{Name: "flaky", FilterSubjects: []string{"events.>"}, URL: flakySrv.URL, Secrets: []string{testSecret},
			Timeout: 2 * time.Second, AckWait: 5 * time.Second, BackOff: []time.Duration{100 * time.Millisecond}, AllowPrivate: true, Ordering: consumer.OrderingNone,
			Start: consumer.Start{Policy: consumer.StartAll}},
	)
	evs, err := b.st.Append(ctx, "order-1", store.NoStream, store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total":1}`)})
	require.NoError(t, err)
	id := event.FormatID(evs[0].ID)

	// 503 then 200: delivered on the retry, with the same Idempotency-Key.
	require.Eventually(t, func() bool { v, _ := flakyOK.Load().(string); return v == id }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, int32(2), flakyCalls.Load())

	// 422: dead-lettered after one attempt: trace reads it settled from
	// the positions bucket, with its dead letter, and the endpoint is
	// never called again.
	require.Eventually(t, func() bool {
		tr, err := consumer.TraceEvent(ctx, b.js, id, consumer.TraceConfig{SourceStream: "order-1"})
		settled := slices.ContainsFunc(tr.Deliveries, func(d consumer.Delivery) bool {
			return d.Subscription == "rejecting" && d.State == consumer.DeliverySettled
		})
		return err == nil && gone.Load() == 1 && settled && len(tr.DeadLetters) == 1
	}, 30*time.Second, 20*time.Millisecond)
	time.Sleep(time.Second) // ten times BackOff: a retry would have come by now
	require.Equal(t, int32(1), gone.Load(), "a 4xx endpoint must not be retried")
}
