package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/proc"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// payload is event data of exactly 256 bytes as Postgres's jsonb prints it
// (`{"pad": "…"}`), the size the targets refer to.
var payload = []byte(`{"pad": "` + strings.Repeat("x", 256-len(`{"pad": ""}`)) + `"}`)

// backlog returns n events spread round-robin over streams streams
// ("bench-<k>"), ids 1..n, versions in order per stream.
func backlog(n, streams int) []event.Event {
	evs := make([]event.Event, n)
	now := time.Now()
	for i := range evs {
		s := i % streams
		evs[i] = event.Event{
			ID: int64(i + 1), Stream: fmt.Sprintf("bench-%d", s), Version: int64(i / streams),
			Name: "BenchEvent", Data: payload, Created: now,
		}
	}
	return evs
}

// freshEventsStream deletes and re-creates the EVENTS JetStream stream,
// and deletes what the consumer derived from an earlier one: the lease
// bucket (whose TTL an earlier row chose) and the positions bucket (its
// records hold the old stream's sequences).
func (e *env) freshEventsStream(ctx context.Context) error {
	if err := e.js.DeleteStream(ctx, wire.DefaultEventsStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	for _, b := range []string{wire.DefaultLeaseBucket, position.DefaultBucket} {
		if err := e.js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return err
		}
	}
	_, err := forward.Provision(ctx, e.js, forward.StreamConfig{})
	return err
}

// publishAsync is the reference: a bare nats.go loop publishing the messages
// the bridge would (same subjects, headers, Nats-Msg-Id, data) with async
// publish, as fast as JetStream stores them. It returns messages per second.
func (e *env) publishAsync(ctx context.Context, evs []event.Event) (float64, error) {
	return publishAsyncTo(ctx, e.js, evs)
}

// publishAsyncTo is publishAsync through js (the embedded server's, or a
// cluster's).
func publishAsyncTo(ctx context.Context, js jetstream.JetStream, evs []event.Event) (float64, error) {
	start := time.Now()
	for i := range evs {
		msg := forward.Message(evs[i], forward.Config{})
		for {
			_, err := js.PublishMsgAsync(msg)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return 0, fmt.Errorf("publish async: %w", err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return 0, errors.New("async publishes not acknowledged after 5 minutes")
	}
	elapsed := time.Since(start)
	if err := expectMessagesIn(ctx, js, len(evs)); err != nil {
		return 0, err
	}
	return float64(len(evs)) / elapsed.Seconds(), nil
}

func (e *env) expectMessages(ctx context.Context, n int) error {
	return expectMessagesIn(ctx, e.js, n)
}

// expectMessagesIn checks that the EVENTS stream behind js holds n messages.
func expectMessagesIn(ctx context.Context, js jetstream.JetStream, n int) error {
	s, err := js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs != uint64(n) {
		return fmt.Errorf("JetStream stream %s holds %d messages, want %d", wire.DefaultEventsStream, info.State.Msgs, n)
	}
	return nil
}

// freshStore drops and migrates a schema and returns the store on it.
func (e *env) freshStore(ctx context.Context, schema string) (*store.Store, error) {
	if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return nil, err
	}
	st, err := store.New(e.pool, store.WithSchema(schema))
	if err != nil {
		return nil, err
	}
	return st, st.Migrate(ctx)
}

// load writes evs into schema's events table with COPY, 100,000 rows a
// statement (the statement trigger records each stream's head).
func (e *env) load(ctx context.Context, schema string, evs []event.Event) error {
	for lo := 0; lo < len(evs); lo += 100_000 {
		hi := min(lo+100_000, len(evs))
		chunk := evs[lo:hi]
		_, err := e.pool.CopyFrom(ctx, pgx.Identifier{schema, "events"},
			[]string{"stream", "version", "name", "data", "meta"},
			pgx.CopyFromSlice(len(chunk), func(i int) ([]any, error) {
				ev := chunk[i]
				return []any{ev.Stream, ev.Version, ev.Name, string(ev.Data), "{}"}, nil
			}))
		if err != nil {
			return fmt.Errorf("copy events %d..%d: %w", lo, hi, err)
		}
	}
	_, err := e.pool.Exec(ctx, "ANALYZE "+schema+".events; ANALYZE "+schema+".streams")
	return err
}

// startBridge runs a bridge process on schema against the embedded server.
func (e *env) startBridge(ctx context.Context, schema string, extra ...string) (*proc.Process, error) {
	p, _, err := e.startBridgeOps(ctx, schema, extra...)
	return p, err
}

// startBridgeOps is startBridge that also returns the bridge's ops port.
func (e *env) startBridgeOps(ctx context.Context, schema string, extra ...string) (*proc.Process, int, error) {
	return e.startBridgeAt(ctx, e.srv.ClientURL(), schema, extra...)
}

// startBridgeAt is startBridgeOps against the NATS server(s) at natsURL; with
// -profile-dir it profiles the bridge from its start-up (bridge-<schema>).
func (e *env) startBridgeAt(ctx context.Context, natsURL, schema string, extra ...string) (*proc.Process, int, error) {
	p, ops, err := e.startBridgeAtURL(ctx, natsURL, e.dbURL, schema, extra...)
	if err == nil {
		e.profile("bridge-"+schema, ops)
	}
	return p, ops, err
}

// startBridgeAtURL is startBridgeAt with the database URL dbURL, without the
// start-up profile: a bridge serves one CPU profile at a time, and the live
// pipeline row takes its own during the run.
func (e *env) startBridgeAtURL(ctx context.Context, natsURL, dbURL, schema string, extra ...string) (*proc.Process, int, error) {
	ops, err := proc.FreePort()
	if err != nil {
		return nil, 0, err
	}
	args := append([]string{"run", "--nats-url", natsURL, "--no-migrate",
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops), "--log-level", "warn"}, extra...)
	if e.cfg.ProfileDir != "" {
		args = append(args, "--pprof")
	}
	p, err := e.procs.Start("bridge", e.cfg.Bin+"/bridge", args, "DATABASE_URL="+dbURL, "JSBRIDGE_SCHEMA="+schema)
	if err != nil {
		return nil, 0, err
	}
	if err := proc.WaitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", ops), p); err != nil {
		return nil, 0, err
	}
	return p, ops, nil
}

// drainRow: the reference publishes the backlog's messages with a bare async
// loop; then the bridge drains the same backlog from Postgres.
func (e *env) drainRow(ctx context.Context) (row, int64, error) {
	n, streams := e.cfg.Events, e.cfg.Streams
	fmt.Printf("bench: drain: building a backlog of %d events over %d streams\n", n, streams)
	evs := backlog(n, streams)

	if err := e.freshEventsStream(ctx); err != nil {
		return row{}, 0, err
	}
	refStart := ownCPU()
	ref, err := e.publishAsync(ctx, evs)
	refCPU := ownCPU() - refStart
	if err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: drain: reference async publish %.0f msg/s\n", ref)

	const schema = "bench_drain"
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return row{}, 0, err
	}
	loadStart := time.Now()
	if err := e.load(ctx, schema, evs); err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: drain: loaded the backlog into Postgres in %s\n", time.Since(loadStart).Round(time.Millisecond))
	evs = nil
	if err := e.freshEventsStream(ctx); err != nil {
		return row{}, 0, err
	}

	start := time.Now()
	bridge, err := e.startBridge(ctx, schema)
	if err != nil {
		return row{}, 0, err
	}
	selfStart, pgStart := ownCPU(), e.postgresCPU(ctx)
	e.profileSelf("server-during-drain")
	err = e.waitFor(ctx, 30*time.Minute, "drain", func() (bool, error) {
		_, fwd, err := st.Totals(ctx)
		return fwd >= int64(n), err
	})
	if err != nil {
		return row{}, 0, err
	}
	ours := float64(n) / time.Since(start).Seconds()
	e.drainCPU = drainCPU{events: n, server: ownCPU() - selfStart, postgres: e.postgresCPU(ctx) - pgStart, reference: refCPU, wall: time.Since(start), refWall: time.Duration(float64(n) / ref * float64(time.Second))}
	if e.drainCPU.bridge, err = processCPU(bridge.Pid()); err != nil {
		return row{}, 0, err
	}
	rss, err := bridge.StopPeakRSS(20 * time.Second)
	if err != nil {
		return row{}, 0, err
	}
	if err := e.expectMessages(ctx, n); err != nil {
		return row{}, 0, err
	}
	fmt.Printf("bench: drain: bridge %.0f events/s, peak RSS %.0f MB\n", ours, float64(rss)/(1<<20))
	ratio := ours / ref
	return row{
		Name:      fmt.Sprintf("drain throughput: %d events (256 B) over %d streams, Postgres → JetStream (file, dedup)", n, streams),
		Ours:      fmt.Sprintf("%.0f events/s", ours),
		Reference: fmt.Sprintf("%.0f msg/s (bare async publish)", ref),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≥ 0.8",
		Met:       ratio >= 0.8,
	}, rss, nil
}
