package consumer_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/deliver/migrate"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// logBuffer is a slog destination tests read while the consumer writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// durablesRan leaves the durables engine's layout on b's server, as a
// deployment of it does: the durable consumer of the unordered
// subscription name.
func (b bundle) durablesRan(t *testing.T, name string) {
	t.Helper()
	s := sub(name, "http://127.0.0.1:1/hook")
	s.Ordering = consumer.OrderingNone
	old, err := consumer.New(b.js, consumer.Config{Engine: consumer.EngineDurables, Subscriptions: []consumer.Subscription{s}})
	require.NoError(t, err)
	require.NoError(t, old.Provision(b.ctx))
}

// migrated writes the key `consumer migrate` writes last.
func (b bundle) migrated(t *testing.T) {
	t.Helper()
	kv, err := position.Bucket(b.ctx, b.js, "", 1)
	require.NoError(t, err)
	_, err = kv.PutString(b.ctx, migrate.DoneKey, "fingerprint")
	require.NoError(t, err)
}

// PickEngine (EngineAuto) picks shared unless the server holds a
// deployment of the durables engine not moved: an events stream without
// AllowDirect, or the old layout (a subscription's durable consumer, the
// partitioned copy) without the migrated key. No events stream is an
// error to wait on.
func TestPickEngine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		server  func(t *testing.T, b bundle)
		engine  string
		unmoved bool
		reason  string
	}{
		{name: "new deployment", server: func(t *testing.T, b bundle) { b.eventsWithDirect(t) },
			engine: consumer.EngineShared, reason: "no layout of the durables engine"},
		{name: "no AllowDirect", server: func(t *testing.T, b bundle) { b.createEvents(t) },
			engine: consumer.EngineDurables, unmoved: true, reason: "does not allow direct gets"},
		{name: "durable consumer not migrated", server: func(t *testing.T, b bundle) { b.eventsWithDirect(t); b.durablesRan(t, "orders") },
			engine: consumer.EngineDurables, unmoved: true, reason: `the durable consumer "orders" of EVENTS exists`},
		{name: "partitioned copy not migrated", server: func(t *testing.T, b bundle) {
			b.eventsWithDirect(t)
			_, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: wire.OrderedStream(wire.DefaultEventsStream), Subjects: []string{"ordered.>"}})
			require.NoError(t, err)
		}, engine: consumer.EngineDurables, unmoved: true, reason: "the partitioned copy EVENTS_ORDERED exists"},
		{name: "migrated, old layout left for cleanup", server: func(t *testing.T, b bundle) {
			b.eventsWithDirect(t)
			b.durablesRan(t, "orders")
			b.migrated(t)
		}, engine: consumer.EngineShared, reason: "`consumer migrate` moved it"},
		{name: "durables layout without AllowDirect, migrated key", server: func(t *testing.T, b bundle) {
			b.createEvents(t)
			b.durablesRan(t, "orders")
			b.migrated(t)
		}, engine: consumer.EngineDurables, unmoved: true, reason: "does not allow direct gets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tc.server(t, b)
			p, err := consumer.PickEngine(b.ctx, b.js, "")
			require.NoError(t, err)
			require.Equal(t, tc.engine, p.Engine, p.Reason)
			require.Equal(t, tc.unmoved, p.Unmoved, p.Reason)
			require.Contains(t, p.Reason, tc.reason)
		})
	}

	b := setup(t)
	_, err := consumer.PickEngine(b.ctx, b.js, "")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "no events stream yet")
}

// A Consumer left at the default engine, started before the bridge made
// the events stream, waits for it and then runs the shared engine: it
// delivers, creates no durable consumer, says so in Engine and
// jsbridge_consumer_engine.
func TestAutoEngineRunsSharedOnANewDeployment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newOrderReceiver(t)
	reg := prometheus.NewRegistry()
	c, err := consumer.New(b.js, consumer.Config{Registerer: reg, Partitions: 4, LeaseTTL: 2 * time.Second,
		Subscriptions: []consumer.Subscription{sharedSub("orders", rc.srv.URL, consumer.OrderingStream)}})
	require.NoError(t, err)
	require.Equal(t, consumer.EngineAuto, c.Config().Engine)
	require.Empty(t, c.Engine(), "not picked before the server was read")

	started := make(chan error, 1)
	go func() { started <- c.Start(b.ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	require.Eventually(t, func() bool { return c.Ready(b.ctx) != nil && strings.Contains(c.Ready(b.ctx).Error(), "EVENTS") },
		10*time.Second, 10*time.Millisecond, "waiting for the events stream")
	b.eventsWithDirect(t) // the bridge's forward.Provision
	require.NoError(t, <-started)
	require.Equal(t, consumer.EngineShared, c.Engine())
	require.Equal(t, 1.0, counterOrGauge(t, reg, "jsbridge_consumer_engine", "shared"))

	const n = 40
	b.publishN(t, 0, n, 4)
	require.Eventually(t, func() bool { return rc.received("/orders") == n }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, rc.inOrder("/orders"))
	s, err := b.js.Stream(b.ctx, wire.DefaultEventsStream)
	require.NoError(t, err)
	infos := s.ListConsumers(b.ctx)
	for ci := range infos.Info() {
		require.Empty(t, ci.Config.Durable, "the shared engine makes no durable consumer on EVENTS")
	}
	require.NoError(t, infos.Err())
}

// An existing deployment of the durables engine is not broken by the
// upgrade: a Consumer left at the default engine finds its layout
// without the migrated key, runs the durables engine on it and warns
// once, naming `consumer migrate` and the docs' section.
func TestAutoEngineKeepsAnUnmovedDeploymentOnDurables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.eventsWithDirect(t)
	b.durablesRan(t, "orders")
	rc := newOrderReceiver(t)
	var logs logBuffer
	reg := prometheus.NewRegistry()
	c, err := consumer.New(b.js, consumer.Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Subscriptions: []consumer.Subscription{sharedSub("orders", rc.srv.URL, consumer.OrderingNone)}})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	require.Equal(t, consumer.EngineDurables, c.Engine())
	require.Equal(t, 1.0, counterOrGauge(t, reg, "jsbridge_consumer_engine", "durables"))

	const n = 20
	b.publishN(t, 0, n, 4)
	require.Eventually(t, func() bool { return rc.received("/orders") == n }, 30*time.Second, 10*time.Millisecond)
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "level=WARN msg=\"engine auto"), out)
	require.Contains(t, out, "consumer migrate")
	require.Contains(t, out, `Moving to shared readers`)
	_, err = b.js.KeyValue(b.ctx, position.DefaultBucket)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound, "nothing of the shared engine made")
}

// counterOrGauge returns the value of metric name's series whose one
// label has value v (0 when there is none).
func counterOrGauge(t *testing.T, reg *prometheus.Registry, name, v string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == v {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
