package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// failureBundle is a store and a JetStream server whose EVENTS stream has a
// short duplicate window, so that only reconciliation (not JetStream's
// dedup) can keep a late re-publish out.
type failureBundle struct {
	st  *store.Store
	dir string // the JetStream store directory, kept across restarts
	srv *embedded.Server
}

const failureDupWindow = time.Second

func failureSetup(t *testing.T) *failureBundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))
	b := &failureBundle{st: st, dir: t.TempDir()}
	b.srv, err = embedded.Start(embedded.Config{Dir: b.dir, Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(func() { b.srv.Shutdown() })
	prov, err := forward.Provision(t.Context(), b.js(t), forward.StreamConfig{DuplicateWindow: failureDupWindow})
	require.NoError(t, err)
	require.Equal(t, failureDupWindow, prov.DuplicateWindow)
	return b
}

// js opens a new client connection with the bridge's reconnect behaviour
// (cmd/bridge: reconnect forever, every second), as a separate process would.
func (b *failureBundle) js(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := b.srv.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// appendStreams appends perStream events to each of streams streams
// ("<prefix>-0", ...) and returns the stream names.
func (b *failureBundle) appendStreams(t *testing.T, prefix string, streams, perStream int) []string {
	t.Helper()
	names := make([]string, streams)
	for i := range names {
		names[i] = prefix + "-" + strconv.Itoa(i)
		evs := make([]store.NewEvent, perStream)
		for j := range evs {
			evs[j] = store.NewEvent{Name: "Happened", Data: fmt.Appendf(nil, `{"n":%d}`, j)}
		}
		_, err := b.st.Append(t.Context(), names[i], store.AnyVersion, evs...)
		require.NoError(t, err)
	}
	return names
}

// drainUntilForwarded runs d's cycles until every appended event is
// forwarded.
func (b *failureBundle) drainUntilForwarded(t *testing.T, d *drain.Drain) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := d.Cycle(t.Context())
		require.NoError(t, err)
		appended, forwarded, err := b.st.Totals(t.Context())
		require.NoError(t, err)
		return appended == forwarded
	}, 60*time.Second, 10*time.Millisecond)
}

// requireNoneBlocked checks that no stream is blocked.
func (b *failureBundle) requireNoneBlocked(t *testing.T) {
	t.Helper()
	blocked, err := b.st.Streams(t.Context(), store.StreamFilter{Blocked: true})
	require.NoError(t, err)
	require.Empty(t, blocked, "no stream blocked")
}

// sentCounter counts the events a forwarder actually sent to JetStream.
type sentCounter struct{ n atomic.Int64 }

func (c *sentCounter) Published(forward.Outcome, time.Duration) { c.n.Add(1) }

func TestBridgeTakeoverAfterDuplicateWindowStoresNoDuplicate(t *testing.T) {
	t.Parallel()
	b := failureSetup(t)
	const streams, perStream = 20, 10
	b.appendStreams(t, "acct", streams, perStream)

	// A bridge claims every stream, publishes part of each batch (all, none,
	// or some: killed mid-batch) and dies before acking.
	claims, err := b.st.Claim(t.Context(), "dead", 100, time.Second)
	require.NoError(t, err)
	require.Len(t, claims, streams)
	evs, err := b.st.Fetch(t.Context(), claims, 100)
	require.NoError(t, err)
	byStream := map[string][]drain.Batch{}
	for _, e := range evs {
		if len(byStream[e.Stream]) == 0 {
			byStream[e.Stream] = []drain.Batch{{Stream: e.Stream}}
		}
		byStream[e.Stream][0].Events = append(byStream[e.Stream][0].Events, e)
	}
	var dead []drain.Batch
	published := 0
	for i, c := range claims {
		bt := byStream[c.Stream][0]
		bt.Events = bt.Events[:i%(perStream+1)]
		if len(bt.Events) > 0 {
			dead = append(dead, bt)
			published += len(bt.Events)
		}
	}
	deadFwd, err := forward.New(b.js(t), forward.Config{})
	require.NoError(t, err)
	for _, r := range deadFwd.Handle(t.Context(), dead) {
		require.NoError(t, r.Err)
	}

	// Another bridge takes over 3 s later: the lease (1 s) and the
	// duplicate window (1 s) have both run out.
	time.Sleep(3 * time.Second)
	sent := &sentCounter{}
	fwd, err := forward.New(b.js(t), forward.Config{Stream: wire.DefaultEventsStream, Observer: sent})
	require.NoError(t, err)
	d, err := drain.New(b.st, fwd, drain.Config{Owner: "alive", Lease: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	b.drainUntilForwarded(t, d)

	assertJetStreamOrdered(t, b.js(t), streams*perStream)
	require.Equal(t, int64(streams*perStream-published), sent.n.Load(),
		"the takeover sent only what the dead bridge had not stored")
	b.requireNoneBlocked(t)
}

// attemptLog records, per stream, when a batch failed.
type attemptLog struct {
	mu       sync.Mutex
	failures map[string][]time.Time
}

// wrap returns h with every failed batch recorded.
func (l *attemptLog) wrap(h drain.Handler) drain.Handler {
	return drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		res := h.Handle(ctx, batches)
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, r := range res {
			if r.Err != nil {
				l.failures[batches[i].Stream] = append(l.failures[batches[i].Stream], now)
			}
		}
		return res
	})
}

// between returns, per stream, the failed attempts in [from, to].
func (l *attemptLog) between(from, to time.Time) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for s, ts := range l.failures {
		for _, at := range ts {
			if !at.Before(from) && !at.After(to) {
				out[s]++
			}
		}
	}
	return out
}

func TestBridgeSurvivesJetStreamOutage(t *testing.T) {
	t.Parallel()
	b := failureSetup(t)
	u, err := url.Parse(b.srv.ClientURL())
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)

	// Two bridges, each a drain with its own forwarder and connection.
	log := &attemptLog{failures: map[string][]time.Time{}}
	logs := &syncBuffer{}
	for _, owner := range []string{"bridge-a", "bridge-b"} {
		fwd, err := forward.New(b.js(t), forward.Config{PublishTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		require.NoError(t, err)
		d, err := drain.New(b.st, log.wrap(fwd), drain.Config{
			Owner: owner, Lease: 10 * time.Second, ClaimLimit: 20, FetchLimit: 20,
			PollInterval: 100 * time.Millisecond, Notifier: b.st, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		require.NoError(t, err)
		runUntilCleanup(t, d.Run)
	}

	// A producer appends to 40 streams all along.
	const streams = 40
	var stop atomic.Bool
	produced := make(chan error, 1)
	go func() {
		for !stop.Load() {
			s := "acct-" + strconv.Itoa(rand.IntN(streams))
			if _, err := b.st.Append(context.Background(), s, store.AnyVersion, store.NewEvent{Name: "Happened", Data: []byte(`{}`)}); err != nil {
				produced <- err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		produced <- nil
	}()
	forwardedSoFar := func() int64 {
		_, fwd, err := b.st.Totals(t.Context())
		require.NoError(t, err)
		return fwd
	}
	require.Eventually(t, func() bool { return forwardedSoFar() >= 200 }, 30*time.Second, 20*time.Millisecond, "draining before the outage")

	// JetStream goes away for 10 s, then comes back on the same store and port.
	b.srv.Shutdown()
	stopped := time.Now()
	time.Sleep(10 * time.Second)
	restarted := time.Now()
	b.srv, err = embedded.Start(embedded.Config{Dir: b.dir, Port: port})
	require.NoError(t, err)
	t.Logf("forwarded when JetStream came back: %d", forwardedSoFar())

	time.Sleep(2 * time.Second) // appends go on after the restart
	stop.Store(true)
	require.NoError(t, <-produced)
	appended, _, err := b.st.Totals(t.Context())
	require.NoError(t, err)
	if !assertEventually(t, func() bool { return forwardedSoFar() == appended }, 90*time.Second) {
		lagging, err := b.st.Streams(t.Context(), store.StreamFilter{Lagging: true})
		require.NoError(t, err)
		for _, si := range lagging {
			t.Logf("lagging: %+v", si)
		}
		t.Logf("bridge log:\n%s", logs.String())
		t.FailNow()
	}

	assertJetStreamOrdered(t, b.js(t), int(appended))
	b.requireNoneBlocked(t)

	// Pacing: while the bus was away, each stream was tried at most 3 times
	// (OutageBackoff 5s, 10s, ... and one-stream probes), counting attempts
	// that fail right after the restart while the clients reconnect.
	perStream := log.between(stopped, restarted.Add(2*time.Second))
	total, most := 0, 0
	for _, n := range perStream {
		total += n
		most = max(most, n)
	}
	t.Logf("failed attempts during the outage: %d streams tried, %d attempts, at most %d for one stream", len(perStream), total, most)
	require.NotEmpty(t, perStream, "the outage was noticed")
	require.LessOrEqual(t, most, 3, "attempts per stream during a 10 s outage: %v", perStream)
}

// assertEventually is require.Eventually that reports instead of failing,
// so the caller can log what it found first.
func assertEventually(t *testing.T, cond func() bool, wait time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cond()
}
