package deliver_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// syncLog is a slog destination written and read concurrently.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// runConsumer runs c until the test ends, then requires a clean return.
// The channel receives Run's result should it return before.
func runConsumer(t *testing.T, c *deliver.Consumer) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
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
	return done
}

// received reports whether rc got a request for event id.
func received(rc *receiver, id string) bool {
	for _, r := range rc.requests() {
		if r.header.Get("Idempotency-Key") == id {
			return true
		}
	}
	return false
}

func portOf(t *testing.T, rawURL string) int {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return port
}

// Provision names the stream it could not find; Run waits for the stream
// (logging each attempt) and delivers once it exists.
func TestRunWaitsForTheStreamToExist(t *testing.T) {
	t.Parallel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	b := bundle{js: js, ctx: t.Context()}
	rc := newReceiver(t, status(http.StatusOK))
	logs := &syncLog{}
	c, err := deliver.New(b.js, deliver.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, sub("a", rc.URL))
	require.NoError(t, err)
	err = c.Provision(b.ctx)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.ErrorContains(t, err, `JetStream stream "EVENTS"`)
	require.ErrorContains(t, err, `subscription "a"`)

	done := runConsumer(t, c)
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "durable consumer not available yet") >= 2 },
		10*time.Second, 5*time.Millisecond, "each attempt is logged")
	select {
	case err := <-done:
		t.Fatalf("Run returned while the stream was missing: %v", err)
	default:
	}
	_, err = b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 1)
}

// A durable consumer deleted while Run pulls is created again, and what
// was published meanwhile is delivered (the new consumer starts over from
// the stream's first message: its predecessor's acks went with it).
func TestDurableConsumerDeletedAtRunTimeIsCreatedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	b.run(t, deliver.Config{}, sub("orders", rc.URL))
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 1)

	require.NoError(t, b.js.DeleteConsumer(b.ctx, "EVENTS", "orders"))
	b.publish(t, 2, "order-1", "OrderShipped", `{}`)
	require.Eventually(t, func() bool { return received(rc, "2") }, 30*time.Second, 10*time.Millisecond, "event 2 delivered after the deletion")
	_, err := b.js.Consumer(b.ctx, "EVENTS", "orders")
	require.NoError(t, err, "the durable consumer exists again")
}

// An endpoint refusing connections opens its breaker; once every message
// is dead-lettered, the half-open probes find nothing to fetch, which is
// normal: Run goes on (it used to return "fetch probe message: nats:
// timeout") and delivers the next event once the endpoint is back.
func TestHalfOpenProbeFindingNoMessageIsNormal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var up atomic.Bool
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if up.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		// A network error: the connection closes without a response.
		hj, ok := w.(http.Hijacker)
		require.True(t, ok)
		conn, _, err := hj.Hijack()
		require.NoError(t, err)
		_ = conn.Close()
	})
	dl := &deadLetters{}
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: 200 * time.Millisecond}, nil, nil)
	require.NoError(t, err)
	s := sub("orders", rc.URL)
	s.MaxDeliver = 1
	s.MaxInFlight = 1
	logs := &syncLog{}
	c, err := deliver.New(b.js, deliver.Config{Breakers: set, DeadLetters: dl, Logger: slog.New(slog.NewTextHandler(logs, nil))}, s)
	require.NoError(t, err)
	done := runConsumer(t, c)
	for id := int64(1); id <= 4; id++ {
		b.publish(t, id, "order-"+string(rune('0'+id)), "OrderPlaced", `{}`)
	}
	require.Eventually(t, func() bool { return len(dl.list()) == 4 }, 15*time.Second, 10*time.Millisecond, "every event dead-lettered")

	// Several open timeouts with nothing to probe: Run must still be running.
	seen := map[breaker.State]bool{}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		seen[set.Breaker(rc.URL).State()] = true
		select {
		case err := <-done:
			t.Fatalf("Run returned with nothing to probe: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.True(t, seen[breaker.HalfOpen], "the breaker went half-open and probed")
	require.NotContains(t, logs.String(), "pulling from JetStream failed", "an empty probe is not a failure")

	up.Store(true)
	b.publish(t, 5, "order-5", "OrderPlaced", `{}`)
	require.Eventually(t, func() bool { return received(rc, "5") }, 10*time.Second, 10*time.Millisecond, "the probe delivers the next event")
	require.Eventually(t, func() bool { return set.Breaker(rc.URL).State() == breaker.Closed }, 5*time.Second, 10*time.Millisecond)
}

// JetStream going away and coming back (a restart on the same port and
// store) ends no subscription: delivery resumes.
func TestRunSurvivesAJetStreamRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := jsbridgetest.StartJetStream(t, embedded.Config{Dir: dir})
	nc, js := jsbridgetest.Connect(t, srv)
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	b := bundle{js: js, ctx: ctx}
	rc := newReceiver(t, status(http.StatusOK))
	b.run(t, deliver.Config{}, sub("orders", rc.URL))
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 1)

	port := portOf(t, srv.ClientURL())
	srv.Shutdown()
	time.Sleep(500 * time.Millisecond)
	srv2, err := embedded.Start(embedded.Config{Dir: dir, Port: port})
	require.NoError(t, err)
	t.Cleanup(srv2.Shutdown)
	require.Eventually(t, func() bool { return nc.IsConnected() }, 15*time.Second, 10*time.Millisecond)
	b.publish(t, 2, "order-1", "OrderShipped", `{}`)
	rc.waitFor(t, 2)
}
