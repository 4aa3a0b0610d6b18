package forward

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/tracing"
)

// BenchmarkPublishSpan is what tracing adds to one event's publish: the
// span, its attributes and the trace headers. off is the default (the
// no-op provider), off-meta an event carrying a trace context with tracing
// off (the headers still go out), on the SDK recording every span.
func BenchmarkPublishSpan(b *testing.B) {
	e := event.Event{ID: 42, Stream: "order-42", Version: 3, Name: "OrderPlaced", Data: []byte(`{}`)}
	traced := e
	traced.Meta.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, c := range []struct {
		name string
		f    *Forwarder
		e    event.Event
	}{
		{"off", &Forwarder{tracer: tracing.Tracer(noop.NewTracerProvider()), spanName: "publish EVENTS"}, e},
		{"off-meta", &Forwarder{tracer: tracing.Tracer(noop.NewTracerProvider()), spanName: "publish EVENTS"}, traced},
		{"on", &Forwarder{tracer: tracing.Tracer(sdk), spanName: "publish EVENTS"}, traced},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			msg := Message(c.e, Config{})
			b.ReportAllocs()
			for b.Loop() {
				endSpan(c.f.startSpan(ctx, &c.e, msg), Outcome{Status: Stored, Sequence: 7})
			}
		})
	}
}

// BenchmarkBatchSpan is what tracing adds to one fast batch of 100 events,
// a third of them carrying a trace context in their meta: the batch's span
// and every message's trace headers. An op is the whole batch.
func BenchmarkBatchSpan(b *testing.B) {
	evs := make([]event.Event, 100)
	for i := range evs {
		evs[i] = event.Event{ID: int64(i + 1), Stream: "order-42", Version: int64(i), Name: "OrderPlaced", Data: []byte(`{}`)}
		if i%3 == 0 {
			evs[i].Meta.TraceParent = fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
		}
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, c := range []struct {
		name string
		f    *Forwarder
	}{
		{"off", &Forwarder{tracer: tracing.Tracer(noop.NewTracerProvider()), spanName: "publish EVENTS"}},
		{"on", &Forwarder{tracer: tracing.Tracer(sdk), spanName: "publish EVENTS"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			msg := Message(evs[0], Config{})
			b.ReportAllocs()
			for b.Loop() {
				bs := c.f.startBatchSpan(ctx, "order-42", evs)
				for i := range evs {
					bs.inject(msg.Header, i)
				}
				bs.end(batchResult{Done: len(evs), Sequence: 100}, len(evs))
			}
		})
	}
}
