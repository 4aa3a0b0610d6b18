package attempt

import (
	"context"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// BenchmarkAttemptSpan is what tracing adds to one attempt: extracting the
// message's trace context, the span, its attributes. off is the default
// (the no-op provider) on a message without trace headers, off-traced a
// message with them (the POST still carries them on), on the SDK.
func BenchmarkAttemptSpan(b *testing.B) {
	set, err := breaker.NewSet(breaker.Settings{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	plain := nats.Header{wire.HeaderMsgID: {"42"}, wire.HeaderID: {"42"}, wire.HeaderType: {"Placed"}, wire.HeaderSubject: {"order-1"},
		wire.HeaderSpecVersion: {"1.0"}, wire.HeaderContentType: {"application/json"}, wire.HeaderStreamVersion: {"3"}}
	withTrace := nats.Header{wire.HeaderTraceParent: {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	for k, v := range plain {
		withTrace[k] = v
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	sub := subscription.Subscription{Name: "orders", URL: "https://example.com/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"}}.WithDefaults()
	cases := []struct {
		name string
		r    *Sender
		h    nats.Header
	}{
		{"off", newTestSender(b, sub, http.DefaultClient, Deps{Breaker: set.Breaker(sub.URL), Tracer: tracing.Tracer(noop.NewTracerProvider())}), plain},
		{"off-traced", newTestSender(b, sub, http.DefaultClient, Deps{Breaker: set.Breaker(sub.URL), Tracer: tracing.Tracer(noop.NewTracerProvider())}), withTrace},
		{"on", newTestSender(b, sub, http.DefaultClient, Deps{Breaker: set.Breaker(sub.URL), Tracer: tracing.Tracer(sdk)}), withTrace},
	}
	for _, c := range cases {
		msg := reader.Event{Subject: "events.order.order-1.Placed", Header: c.h}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, st := c.r.start(context.Background(), msg, "42", 1)
				st.Decide(OutcomeAck, "2xx", "")
				c.r.End(st)
			}
		})
	}
}
