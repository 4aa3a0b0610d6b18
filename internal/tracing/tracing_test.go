package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/wire"
)

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Injecting into a nats.Header keeps the names lowercase, as wire spells
// them (propagation.HeaderCarrier would write "Traceparent", which NATS,
// matching names exactly, would not find under "traceparent").
func TestHeaderCarrierKeepsNamesLowercase(t *testing.T) {
	t.Parallel()
	src := HeaderCarrier(nats.Header{wire.HeaderTraceParent: {tp}, wire.HeaderTraceState: {"k=v"}})
	ctx := Propagator.Extract(context.Background(), src)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.TraceState().Get("k") != "v" {
		t.Fatalf("extracted %+v", sc)
	}
	h := nats.Header{}
	Propagator.Inject(ctx, HeaderCarrier(h))
	if got := h[wire.HeaderTraceParent]; len(got) != 1 || got[0] != tp {
		t.Errorf("injected traceparent %q, want %q under %q; header %v", got, tp, wire.HeaderTraceParent, h)
	}
	if got := h[wire.HeaderTraceState]; len(got) != 1 || got[0] != "k=v" {
		t.Errorf("injected tracestate %q; header %v", got, h)
	}
	if len(h) != 2 || len(HeaderCarrier(h).Keys()) != 2 {
		t.Errorf("header %v, want the two trace headers only", h)
	}
}

// A publisher that canonicalised the name ("Traceparent") is still read.
func TestHeaderCarrierGetAnyCase(t *testing.T) {
	t.Parallel()
	c := HeaderCarrier(nats.Header{"Traceparent": {tp}})
	if got := c.Get(wire.HeaderTraceParent); got != tp {
		t.Errorf("Get = %q", got)
	}
	if got := c.Get(wire.HeaderTraceState); got != "" {
		t.Errorf("Get of a missing header = %q", got)
	}
}
