package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

type bundle struct {
	pool   *pgxpool.Pool
	schema string
	js     jetstream.JetStream
	store  *store.Store
}

// setup gives a test its own Postgres schema (migrated) and its own
// embedded JetStream server.
func setup(t *testing.T) bundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	return bundle{pool: pool, schema: schema, js: js, store: st}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// logBuffer collects log records written from any goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func TestNewInvalidConfigNamesTheField(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // lazy: New touches nothing
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))

	cases := []struct {
		name  string
		cfg   bridge.Config
		field string
		value string
	}{
		{"schema", bridge.Config{Schema: "Bad-Schema"}, "Schema", `"Bad-Schema"`},
		{"events table", bridge.Config{EventsTable: "nodot"}, "EventsTable", `"nodot"`},
		{"stream", bridge.Config{Stream: "EV.ENTS"}, "Stream", `"EV.ENTS"`},
		{"subject prefix", bridge.Config{SubjectPrefix: "events.*"}, "SubjectPrefix", `"events.*"`},
		{"duplicate window", bridge.Config{DuplicateWindow: -time.Second}, "DuplicateWindow", "-1s"},
		{"max age", bridge.Config{MaxAge: -time.Second}, "MaxAge", "-1s"},
		{"max age below the duplicate window", bridge.Config{MaxAge: time.Minute}, "MaxAge", "1m0s"},
		{"max bytes", bridge.Config{MaxBytes: -1}, "MaxBytes", "-1"},
		{"max msgs per subject", bridge.Config{MaxMsgsPerSubject: -1}, "MaxMsgsPerSubject", "-1"},
		{"lease", bridge.Config{Lease: -time.Second}, "Lease", "-1s"},
		{"lease below 1ms", bridge.Config{Lease: time.Microsecond}, "Lease", "1µs"},
		{"claim limit", bridge.Config{ClaimLimit: -1}, "ClaimLimit", "-1"},
		{"fetch limit", bridge.Config{FetchLimit: -2}, "FetchLimit", "-2"},
		{"poll interval", bridge.Config{PollInterval: -time.Millisecond}, "PollInterval", "-1ms"},
		{"max retries", bridge.Config{MaxRetries: -3}, "MaxRetries", "-3"},
		{"max in flight", bridge.Config{MaxInFlight: -4}, "MaxInFlight", "-4"},
		{"publish timeout", bridge.Config{PublishTimeout: -time.Second}, "PublishTimeout", "-1s"},
		{"shutdown grace", bridge.Config{ShutdownGrace: -time.Second}, "ShutdownGrace", "-1s"},
		{"settle timeout", bridge.Config{SettleTimeout: -time.Second}, "SettleTimeout", "-1s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Logger = quiet()
			b, err := bridge.New(pool, js, c.cfg)
			require.Nil(t, b)
			require.ErrorIs(t, err, bridge.ErrInvalidConfig)
			require.ErrorContains(t, err, c.field+" "+c.value)
		})
	}

	t.Run("nil pool", func(t *testing.T) {
		_, err := bridge.New(nil, js, bridge.Config{})
		require.ErrorIs(t, err, bridge.ErrInvalidConfig)
		require.ErrorContains(t, err, "pool")
	})
	t.Run("nil JetStream", func(t *testing.T) {
		_, err := bridge.New(pool, nil, bridge.Config{})
		require.ErrorIs(t, err, bridge.ErrInvalidConfig)
		require.ErrorContains(t, err, "JetStream")
	})
	t.Run("defaults filled, publish timeout fitted to the lease", func(t *testing.T) {
		var logs logBuffer
		b, err := bridge.New(pool, js, bridge.Config{Lease: 10 * time.Second, PublishTimeout: 9 * time.Second, Logger: logs.logger()})
		require.NoError(t, err)
		got := b.Config()
		require.Equal(t, 4*time.Second, got.PublishTimeout, "40% of the lease")
		require.Contains(t, logs.String(), "PublishTimeout 9s does not fit Lease 10s (at most 40% of it): using 4s")
		require.Equal(t, bridge.DefaultStream, got.Stream)
		require.Equal(t, bridge.DefaultSchema, got.Schema)
		require.Equal(t, bridge.DefaultClaimLimit, got.ClaimLimit)
		require.Equal(t, bridge.DefaultSettleTimeout, got.SettleTimeout)
	})
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		_, err := bridge.New(pool, js, bridge.Config{Registerer: reg, Logger: quiet()})
		require.NoError(t, err)
		_, err = bridge.New(pool, js, bridge.Config{Registerer: reg, Logger: quiet()})
		require.Error(t, err)
	})
}

// jsEvents reads the whole JetStream stream and returns, per source
// stream, the versions in stored order and how often each event id was
// stored.
func jsEvents(t *testing.T, js jetstream.JetStream, stream string) (map[string][]int64, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	versions, ids := map[string][]int64{}, map[string]int{}
	if info.State.Msgs == 0 {
		return versions, ids
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for got := uint64(0); got < info.State.Msgs; {
		batch, err := cons.Fetch(int(min(info.State.Msgs-got, 1000)), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			got++
			h := m.Headers()
			v, err := strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
			require.NoError(t, err)
			versions[h.Get(wire.HeaderSubject)] = append(versions[h.Get(wire.HeaderSubject)], v)
			ids[h.Get(wire.HeaderMsgID)]++
		}
		require.NoError(t, batch.Error())
	}
	return versions, ids
}

func jsCount(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0
	}
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

func TestDrainsAppendedEventsIntoJetStream(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	ctx := context.Background()
	schema := "x" + bb.schema // a schema the bridge migrates itself
	t.Cleanup(func() { _, _ = bb.pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	b, err := bridge.New(bb.pool, bb.js, bridge.Config{Schema: schema, Migrate: true, PollInterval: 50 * time.Millisecond, Logger: quiet()})
	require.NoError(t, err)
	require.Error(t, b.Ready(ctx), "no JetStream stream before Start")
	require.NoError(t, b.Start(ctx))
	t.Cleanup(func() { _ = b.Stop(context.Background()) }) // a failure before its Stop below
	require.ErrorIs(t, b.Start(ctx), bridge.ErrAlreadyStarted)
	require.NoError(t, b.Ready(ctx))

	st, err := store.New(bb.pool, store.WithSchema(schema))
	require.NoError(t, err)
	for v := range 5 {
		_, err := st.Append(ctx, "order-1", int64(v-1), store.NewEvent{Name: "Step", Data: fmt.Appendf(nil, `{"n":%d}`, v)})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return jsCount(t, bb.js, bridge.DefaultStream) == 5 }, 30*time.Second, 20*time.Millisecond)
	versions, ids := jsEvents(t, bb.js, bridge.DefaultStream)
	require.Equal(t, map[string][]int64{"order-1": {0, 1, 2, 3, 4}}, versions)
	require.Len(t, ids, 5)
	require.NoError(t, b.Stop(ctx))
	require.NoError(t, b.Stop(ctx), "a second Stop is harmless")
}

// Stop in the middle of a busy drain: every event JetStream holds is
// acked (the watermarks say so), and a second bridge drains the rest, so
// that JetStream holds every event exactly once, each stream in order.
func TestStopDuringBusyDrainLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	ctx := context.Background()
	const streams, perStream = 200, 20
	heads := map[string]int64{}
	for s := range streams {
		name := fmt.Sprintf("load-%d", s)
		evs := make([]store.NewEvent, perStream)
		for i := range evs {
			evs[i] = store.NewEvent{Name: "Tick", Data: fmt.Appendf(nil, `{"i":%d}`, i)}
		}
		_, err := bb.store.Append(ctx, name, -1, evs...)
		require.NoError(t, err)
		heads[name] = perStream - 1
	}
	// Small cycles, so that the drain is many cycles long.
	cfg := bridge.Config{Schema: bb.schema, ClaimLimit: 10, FetchLimit: 5, PollInterval: 50 * time.Millisecond, Logger: quiet()}
	first, err := bridge.New(bb.pool, bb.js, cfg)
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	t.Cleanup(func() { _ = first.Stop(context.Background()) }) // a failure before its Stop below
	require.Eventually(t, func() bool { return jsCount(t, bb.js, bridge.DefaultStream) >= 200 }, 30*time.Second, 5*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, first.Stop(stopCtx))

	published := jsCount(t, bb.js, bridge.DefaultStream)
	require.Less(t, published, uint64(streams*perStream), "Stop came after the drain was done: the test did not stop a busy drain")
	t.Logf("stopped with %d of %d events in JetStream", published, streams*perStream)
	versions, _ := jsEvents(t, bb.js, bridge.DefaultStream)
	infos, err := bb.store.Streams(ctx, store.StreamFilter{})
	require.NoError(t, err)
	require.Len(t, infos, streams)
	for _, in := range infos {
		require.Equal(t, in.Watermark+1, int64(len(versions[in.Stream])), "stream %s: what JetStream holds is what was acked", in.Stream)
		require.False(t, in.Blocked, in.Stream)
		// Settled streams hold no lease; one postponed (a publish cut
		// short counted as an outage) holds an ended one.
		if in.LeasedBy != "" {
			t.Logf("stream %s: lease of %s until %s (%s), next attempt %s, error %q", in.Stream, in.LeasedBy, in.LeasedUntil, time.Until(in.LeasedUntil), in.NextAttempt, in.Error)
		}
		require.False(t, in.LeasedBy != "" && time.Until(in.LeasedUntil) > time.Second, "stream %s: a lease still held after Stop", in.Stream)
	}

	second, err := bridge.New(bb.pool, bb.js, cfg)
	require.NoError(t, err)
	require.NoError(t, second.Start(ctx))
	t.Cleanup(func() { _ = second.Stop(context.Background()) })
	require.Eventually(t, func() bool { return jsCount(t, bb.js, bridge.DefaultStream) >= streams*perStream }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		infos, err := bb.store.Streams(ctx, store.StreamFilter{Lagging: true})
		return err == nil && len(infos) == 0
	}, time.Minute, 20*time.Millisecond, "every stream acked")

	versions, ids := jsEvents(t, bb.js, bridge.DefaultStream)
	require.Len(t, ids, streams*perStream)
	for id, n := range ids {
		require.Equal(t, 1, n, "event %s stored %d times", id, n)
	}
	require.Len(t, versions, len(heads))
	for stream, head := range heads {
		vs := versions[stream]
		require.Len(t, vs, int(head+1), stream)
		for i, v := range vs {
			require.Equal(t, int64(i), v, "stream %s: position %d holds version %d", stream, i, v)
		}
	}
}

// Start says when the duplicate window cannot cover a takeover's
// re-publish (lease plus publish timeout), and drains all the same.
func TestStartWarnsOfAShortDuplicateWindow(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	var logs logBuffer
	b, err := bridge.New(bb.pool, bb.js, bridge.Config{Schema: bb.schema, DuplicateWindow: 10 * time.Second, Logger: logs.logger()})
	require.NoError(t, err)
	require.NotContains(t, logs.String(), "DuplicateWindow")
	require.NoError(t, b.Start(context.Background()))
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	require.Contains(t, logs.String(), "DuplicateWindow is shorter than Lease plus PublishTimeout")
	require.Contains(t, logs.String(), "need=35s")
}

// The life cycle every front door shares: Stop before Start does nothing,
// Stop ends a foreground Run, a Bridge runs once, a second Stop is safe.
func TestStopBeforeStartAndStopEndsRun(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	b, err := bridge.New(bb.pool, bb.js, bridge.Config{Schema: bb.schema, PollInterval: time.Hour, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, b.Stop(context.Background()), "Stop before Start")

	ran := make(chan error, 1)
	go func() { ran <- b.Run(context.Background()) }()
	// A Stop that comes before Run has begun does nothing; once it has,
	// Stop ends it.
	require.Eventually(t, func() bool {
		require.NoError(t, b.Stop(context.Background()))
		select {
		case err := <-ran:
			require.NoError(t, err)
			return true
		default:
			return false
		}
	}, 10*time.Second, 5*time.Millisecond, "Stop ends the foreground Run")
	require.NoError(t, b.Stop(context.Background()), "a second Stop")
	require.ErrorIs(t, b.Start(context.Background()), bridge.ErrAlreadyStarted, "a Bridge runs once")
	require.ErrorIs(t, b.Run(context.Background()), bridge.ErrAlreadyStarted, "a Bridge runs once")
}
