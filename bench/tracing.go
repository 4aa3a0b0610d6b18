package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// discardExporter is the exporter of the "on" runs: the SDK samples,
// records, batches and hands every span over, and the spans are counted and
// dropped, so the row measures what tracing costs the process, not a
// collector's network.
type discardExporter struct{ spans atomic.Int64 }

func (d *discardExporter) ExportSpans(_ context.Context, spans []trace.ReadOnlySpan) error {
	d.spans.Add(int64(len(spans)))
	return nil
}
func (d *discardExporter) Shutdown(context.Context) error { return nil }

// tracerProvider returns the provider of one run: the API's no-op one
// (tracing off, the default) or an SDK provider with a batch span processor
// (OTEL_BSP_* defaults) and a discarding exporter.
func tracerProvider(on bool) (oteltrace.TracerProvider, *discardExporter, func()) {
	if !on {
		return noop.NewTracerProvider(), nil, func() {}
	}
	exp := &discardExporter{}
	tp := trace.NewTracerProvider(trace.WithBatcher(exp))
	return tp, exp, func() { _ = tp.Shutdown(context.Background()) }
}

// traced is one run: throughput, CPU time of this process (the bridge or
// the consumer, the JetStream server, the receiver) per event, and the
// spans the exporter got.
type traced struct {
	rate, cpu float64 // per second; µs per event
	spans     int64
}

// tracingRow: the in-process bridge drains a backlog and the in-process
// consumer delivers messages, each with tracing off and on, twice in
// alternation (off, on, off, on); the better run of each counts (the
// fastest, and the least CPU per event: on a shared machine the slower
// runs measure the neighbours).
func (e *env) tracingRow(ctx context.Context) (row, error) {
	n, m := tracingSizes(e.cfg)
	var drain, cons [2]traced // [off, on]
	better := func(best *traced, t traced) {
		if best.rate == 0 || t.rate > best.rate {
			best.rate = t.rate
		}
		if best.cpu == 0 || t.cpu < best.cpu {
			best.cpu = t.cpu
		}
		best.spans = t.spans
	}
	for round := range 2 {
		for i, on := range []bool{false, true} {
			d, err := e.tracedDrain(ctx, n, on)
			if err != nil {
				return row{}, fmt.Errorf("drain, tracing %v: %w", on, err)
			}
			better(&drain[i], d)
			c, err := e.tracedConsumer(ctx, m, on, round)
			if err != nil {
				return row{}, fmt.Errorf("consumer, tracing %v: %w", on, err)
			}
			better(&cons[i], c)
			fmt.Printf("bench: tracing %v: drain %.0f events/s, CPU %.1f µs/event (%d spans); consumer %.0f deliveries/s, CPU %.1f µs/delivery (%d spans)\n",
				on, d.rate, d.cpu, d.spans, c.rate, c.cpu, c.spans)
		}
	}
	spans := [2]int64{drain[1].spans, cons[1].spans}
	// The batch span processor drops spans when its queue (2048) is full,
	// as it does in production (OTEL_BSP_MAX_QUEUE_SIZE); none exported
	// would mean the run did not trace at all.
	if spans[0] == 0 || spans[1] == 0 {
		return row{}, fmt.Errorf("tracing on exported %d publish and %d attempt spans", spans[0], spans[1])
	}
	// The ratio is of CPU per event (off ÷ on): on a machine shared with
	// other work it varies far less between runs than the throughput,
	// which the row shows beside it.
	dr, cr := drain[0].cpu/drain[1].cpu, cons[0].cpu/cons[1].cpu
	return row{
		Name: fmt.Sprintf("tracing on vs off (in-process bridge draining %d events, consumer delivering %d messages; on = SDK, batch span processor, discarding exporter)", n, m),
		Ours: fmt.Sprintf("on: drain %.0f events/s (CPU %.1f µs/event), consumer %.0f deliveries/s (CPU %.1f µs/delivery); %d and %d spans exported in the last round",
			drain[1].rate, drain[1].cpu, cons[1].rate, cons[1].cpu, spans[0], spans[1]),
		Reference: fmt.Sprintf("off (no-op provider, the default): drain %.0f events/s (CPU %.1f µs/event), consumer %.0f deliveries/s (CPU %.1f µs/delivery)",
			drain[0].rate, drain[0].cpu, cons[0].rate, cons[0].cpu),
		Ratio: fmt.Sprintf("CPU per event off ÷ on: drain %.2f, consumer %.2f (throughput on ÷ off: %.2f, %.2f)", dr, cr,
			drain[1].rate/drain[0].rate, cons[1].rate/cons[0].rate),
		Target: "≥ 0.9 (on costs at most 11% more CPU per event)",
		Met:    dr >= 0.9 && cr >= 0.9,
	}, nil
}

// tracingSizes are the events the tracing row drains and the messages it
// delivers, in each of its eight runs: half the drain row's events (at
// least 50,000) and the consumer row's messages (at least 20,000); a quick
// run drains a quarter of its drain row's events and delivers a quarter
// of its consumer row's messages, which keeps the row near 15 s of CPU.
func tracingSizes(cfg config) (events, messages int) {
	if cfg.Quick {
		return max(cfg.Events/4, 1000), max(cfg.Messages/4, 1000)
	}
	return max(cfg.Events/2, 50_000), max(cfg.Messages, 20_000)
}

// tracedDrain loads n events (a third of them carrying a trace context in
// their meta) and drains them with an in-process bridge; it returns events
// per second and the spans exported.
func (e *env) tracedDrain(ctx context.Context, n int, on bool) (traced, error) {
	const schema = "bench_tracing"
	st, err := e.freshStore(ctx, schema)
	if err != nil {
		return traced{}, err
	}
	if err := e.load(ctx, schema, backlog(n, max(n/100, 1))); err != nil {
		return traced{}, err
	}
	// A third of the events were appended in a traced request.
	if _, err := e.pool.Exec(ctx, `UPDATE `+schema+`.events SET meta = jsonb_build_object('`+event.MetaTraceParent+`',
		'00-' || lpad(to_hex(id), 32, '0') || '-' || lpad(to_hex(id), 16, '0') || '-01') WHERE id % 3 = 0`); err != nil {
		return traced{}, err
	}
	if err := e.freshEventsStream(ctx); err != nil {
		return traced{}, err
	}
	tp, exp, stop := tracerProvider(on)
	b, err := bridge.New(e.pool, e.js, bridge.Config{Schema: schema, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		return traced{}, err
	}
	start, cpu := time.Now(), ownCPU()
	if err := b.Start(ctx); err != nil {
		return traced{}, err
	}
	err = e.waitFor(ctx, 30*time.Minute, "traced drain", func() (bool, error) {
		_, fwd, err := st.Totals(ctx)
		return fwd >= int64(n), err
	})
	t := traced{rate: float64(n) / time.Since(start).Seconds(), cpu: float64((ownCPU() - cpu).Microseconds()) / float64(n)}
	stopErr := b.Stop(context.Background())
	stop()
	if err == nil {
		err = stopErr
	}
	if exp != nil {
		t.spans = exp.spans.Load()
	}
	return t, err
}

// tracedConsumer publishes m messages as the bridge does (with a
// traceparent when on) and delivers them with an in-process consumer to a
// loopback receiver; it returns deliveries per second and the spans
// exported.
func (e *env) tracedConsumer(ctx context.Context, m int, on bool, round int) (traced, error) {
	if err := e.freshEventsStream(ctx); err != nil {
		return traced{}, err
	}
	for i, ev := range backlog(m, 1000) {
		msg := forward.Message(ev, forward.Config{})
		if on {
			msg.Header[wire.HeaderTraceParent] = []string{fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
		}
		for {
			_, err := e.js.PublishMsgAsync(msg)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return traced{}, fmt.Errorf("publish async: %w", err)
			}
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return traced{}, fmt.Errorf("async publishes not acknowledged")
	}
	s, err := newSink()
	if err != nil {
		return traced{}, err
	}
	defer s.srv.Close()
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	tp, exp, stop := tracerProvider(on)
	defer stop()
	c, err := consumer.New(e.js, consumer.Config{TracerProvider: tp, Subscriptions: []consumer.Subscription{{
		Name: fmt.Sprintf("bench-tracing-%v-%d", on, round), FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: s.url,
		Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString(secret)}, AllowPrivate: true, MaxInFlight: e.cfg.InFlight,
		Start: consumer.Start{Policy: consumer.StartAll}, // the round's events are stored before it starts
	}}})
	if err != nil {
		return traced{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start, cpu := time.Now(), ownCPU()
	go func() { done <- c.Run(rctx) }()
	err = e.waitFor(ctx, 10*time.Minute, "traced consumer", func() (bool, error) { return s.n.Load() >= int64(m), nil })
	t := traced{rate: float64(m) / time.Since(start).Seconds(), cpu: float64((ownCPU() - cpu).Microseconds()) / float64(m)}
	cancel()
	if runErr := <-done; err == nil {
		err = runErr
	}
	stop()
	if exp != nil {
		t.spans = exp.spans.Load()
	}
	return t, err
}
