package forward_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

const appTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// traced returns a tracer provider recording into an in-memory exporter.
func traced(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return tp, exp
}

// parseTraceParent returns the trace and parent span id of a traceparent.
func parseTraceParent(t *testing.T, v string) (trace.TraceID, trace.SpanID) {
	t.Helper()
	require.Len(t, v, 55, "traceparent %q", v)
	tid, err := trace.TraceIDFromHex(v[3:35])
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(v[36:52])
	require.NoError(t, err)
	return tid, sid
}

// Every event gets a publish span, one at a time and in fast batches: a
// child of the trace in its meta, or the root of its own trace; the
// message's traceparent names that span, lowercase, as wire spells it.
func TestPublishSpans(t *testing.T) {
	t.Parallel()
	tp, exp := traced(t)
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{TracerProvider: tp}})
	appTrace, appSpan := parseTraceParent(t, appTraceParent)

	single := events("one-1", 1, 2)
	single[0].Meta.TraceParent = appTraceParent
	single[0].Meta.TraceState = "vendor=x"
	for _, o := range b.fwd.Publish(t.Context(), single) {
		require.NoError(t, o.Err)
	}
	batch := events("many-1", 10, 4)
	batch[1].Meta.TraceParent = appTraceParent
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "many-1", Events: batch}})
	require.NoError(t, res[0].Err)
	require.Equal(t, 4, res[0].Done)

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range exp.GetSpans().Snapshots() {
		spans[s.SpanContext().SpanID()] = s
	}
	require.Len(t, spans, 6, "one publish span per event")

	msgs := append(b.stored(t, "events.one."), b.stored(t, "events.many.")...)
	require.Len(t, msgs, 6)
	traces := map[trace.TraceID]bool{}
	for _, m := range msgs {
		id := m.Header.Get(wire.HeaderID)
		tid, sid := parseTraceParent(t, m.Header.Get(wire.HeaderTraceParent))
		s, ok := spans[sid]
		require.True(t, ok, "event %s: traceparent names no publish span", id)
		require.Equal(t, tid, s.SpanContext().TraceID())
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, "publish "+wire.DefaultEventsPrefix, s.Name(), "Config.Stream is empty: the span is named by the prefix")
		if id == "1" || id == "11" {
			require.Equal(t, appTrace, tid, "event %s continues the trace in its meta", id)
			require.Equal(t, appSpan, s.Parent().SpanID())
			require.True(t, s.Parent().IsRemote())
		} else {
			require.False(t, s.Parent().IsValid(), "event %s without a trace context starts one", id)
			require.False(t, traces[tid], "event %s shares a trace with another", id)
			traces[tid] = true
		}
		if id == "1" {
			require.Equal(t, "vendor=x", m.Header.Get(wire.HeaderTraceState))
		}
	}
}

// With tracing off (a no-op provider) an event's own trace context still
// travels in its headers, and an event without one gets no trace headers.
func TestPublishWithoutTracingKeepsMetaTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{TracerProvider: noop.NewTracerProvider()}})
	evs := events("off-1", 1, 2)
	evs[0].Meta.TraceParent = appTraceParent
	for _, o := range b.fwd.Publish(t.Context(), evs) {
		require.NoError(t, o.Err)
	}
	msgs := b.stored(t, "events.off.")
	require.Len(t, msgs, 2)
	require.Equal(t, appTraceParent, msgs[0].Header.Get(wire.HeaderTraceParent))
	require.Empty(t, msgs[1].Header.Values(wire.HeaderTraceParent))
}
