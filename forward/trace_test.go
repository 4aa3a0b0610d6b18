package forward_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
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

// An event published on its own gets a publish span, a child of the trace
// in its meta (or the root of its own trace); the message's traceparent
// names that span, lowercase, as wire spells it. A fast batch gets one
// publish span: an event with a valid trace context in its meta carries
// that context unchanged and the batch span links to it; every other event
// (one with an invalid traceparent too) carries the batch span's context.
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
	batch[1].Meta.TraceState = "vendor=y"
	batch[2].Meta.TraceParent = "00-not-a-trace-parent-01"
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "many-1", Events: batch}})
	require.NoError(t, res[0].Err)
	require.Equal(t, 4, res[0].Done)

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var batchSpan sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		spans[s.SpanContext().SpanID()] = s
		attrs := attribute.NewSet(s.Attributes()...)
		if v, ok := attrs.Value("messaging.batch.message_count"); ok {
			require.Nil(t, batchSpan, "one span for the batch")
			require.EqualValues(t, 4, v.AsInt64())
			batchSpan = s
		}
	}
	require.Len(t, spans, 3, "a span per single publish, one for the batch")
	require.NotNil(t, batchSpan)
	require.False(t, batchSpan.Parent().IsValid(), "the batch span starts its own trace")
	require.Equal(t, trace.SpanKindProducer, batchSpan.SpanKind())
	require.Len(t, batchSpan.Links(), 1, "linked to the one valid trace context in the batch's meta")
	require.Equal(t, appTrace, batchSpan.Links()[0].SpanContext.TraceID())
	require.Equal(t, appSpan, batchSpan.Links()[0].SpanContext.SpanID())
	attrs := attribute.NewSet(batchSpan.Attributes()...)
	for k, want := range map[attribute.Key]string{"jsbridge.publish.status": "stored", "jsbridge.stream": "many-1", "jsbridge.event_id.first": "10", "jsbridge.event_id.last": "13"} {
		v, _ := attrs.Value(k)
		require.Equal(t, want, v.Emit(), "attribute %s", k)
	}
	v, _ := attrs.Value("jsbridge.publish.stored")
	require.EqualValues(t, 4, v.AsInt64())

	msgs := append(b.stored(t, "events.one."), b.stored(t, "events.many.")...)
	require.Len(t, msgs, 6)
	traces := map[trace.TraceID]bool{}
	for _, m := range msgs {
		id := m.Header.Get(wire.HeaderID)
		if id == "11" {
			require.Equal(t, appTraceParent, m.Header.Get(wire.HeaderTraceParent), "event 11 carries its own trace context unchanged")
			require.Equal(t, "vendor=y", m.Header.Get(wire.HeaderTraceState))
			continue
		}
		tid, sid := parseTraceParent(t, m.Header.Get(wire.HeaderTraceParent))
		s, ok := spans[sid]
		require.True(t, ok, "event %s: traceparent names no publish span", id)
		require.Equal(t, tid, s.SpanContext().TraceID())
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, "publish "+wire.DefaultEventsPrefix, s.Name(), "Config.Stream is empty: the span is named by the prefix")
		switch id {
		case "1":
			require.Equal(t, appTrace, tid, "event %s continues the trace in its meta", id)
			require.Equal(t, appSpan, s.Parent().SpanID())
			require.True(t, s.Parent().IsRemote())
			require.Equal(t, "vendor=x", m.Header.Get(wire.HeaderTraceState))
		case "2":
			require.False(t, s.Parent().IsValid(), "event %s without a trace context starts one", id)
			require.False(t, traces[tid], "event %s shares a trace with another", id)
			traces[tid] = true
		default:
			require.Equal(t, batchSpan.SpanContext().SpanID(), sid, "event %s of the batch carries the batch span", id)
			require.Empty(t, m.Header.Values(wire.HeaderTraceState), "event %s", id)
		}
	}
}

// With tracing off (a no-op provider) an event's own trace context still
// travels in its headers, one at a time and in a fast batch, and an event
// without one gets no trace headers.
func TestPublishWithoutTracingKeepsMetaTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{}, cfg: forward.Config{TracerProvider: noop.NewTracerProvider()}})
	evs := events("off-1", 1, 2)
	evs[0].Meta.TraceParent = appTraceParent
	for _, o := range b.fwd.Publish(t.Context(), evs) {
		require.NoError(t, o.Err)
	}
	batch := events("offbatch-1", 10, 3)
	batch[1].Meta.TraceParent = appTraceParent
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "offbatch-1", Events: batch}})
	require.NoError(t, res[0].Err)
	msgs := append(b.stored(t, "events.off."), b.stored(t, "events.offbatch.")...)
	require.Len(t, msgs, 5)
	for i, m := range msgs {
		if i == 0 || i == 3 {
			require.Equal(t, appTraceParent, m.Header.Get(wire.HeaderTraceParent), "message %d", i)
			continue
		}
		require.Empty(t, m.Header.Values(wire.HeaderTraceParent), "message %d", i)
	}
}
