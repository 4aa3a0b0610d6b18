package forward

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// Tracing (OpenTelemetry, W3C Trace Context): every event sent on its own
// (not in a fast batch; see batchtrace.go for those) gets a publish span
// of kind producer, named "publish <JetStream stream>" (the subject prefix
// when Config.Stream is empty). Its parent is the trace context of the
// event's meta (event.Meta.TraceParent) when it holds a valid one, so the
// trace the app appended the event in continues; otherwise the span is the
// root of a new trace, one per event. The span's context goes into the
// message's traceparent and tracestate headers (wire.HeaderTraceParent),
// which the consumer continues.
//
// With a no-op tracer provider (the default when the application installs
// no SDK) nothing is recorded; an event whose meta carries a trace context
// still gets that context in its headers, so the trace continues across a
// bridge that exports nothing.

// metaCarrier reads an event's trace context for the W3C propagator.
type metaCarrier struct{ m *event.Meta }

func (c metaCarrier) Get(key string) string {
	switch key {
	case wire.HeaderTraceParent:
		return c.m.TraceParent
	case wire.HeaderTraceState:
		return c.m.TraceState
	}
	return ""
}
func (metaCarrier) Set(string, string) {}
func (metaCarrier) Keys() []string     { return []string{wire.HeaderTraceParent, wire.HeaderTraceState} }

// producerKind is the publish spans' kind, made once: an option built per
// event was an allocation per event even with tracing off.
var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// startSpan starts e's publish span and writes its context into msg's
// headers. The returned span must be ended (endSpan).
func (f *Forwarder) startSpan(ctx context.Context, e *event.Event, msg *nats.Msg) trace.Span {
	if e.Meta.TraceParent != "" {
		ctx = tracing.Propagator.Extract(ctx, metaCarrier{&e.Meta})
	}
	ctx, span := f.tracer.Start(ctx, f.spanName, producerKind)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", msg.Subject),
			attribute.String("messaging.message.id", msg.Header.Get(wire.HeaderMsgID)), // event.FormatID(e.ID), formatted once
			tracing.AttrStream.String(e.Stream),
			tracing.AttrStreamVersion.Int64(e.Version),
			tracing.AttrEventName.String(e.Name),
		)
	}
	if span.SpanContext().IsValid() {
		tracing.Propagator.Inject(ctx, tracing.HeaderCarrier(msg.Header))
	}
	return span
}

// endSpan ends a publish span with the event's outcome.
func endSpan(span trace.Span, o Outcome) {
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrPublishStatus.String(o.Status.String()))
		if o.Sequence != 0 {
			span.SetAttributes(attribute.Int64("messaging.nats.jetstream.sequence", int64(o.Sequence)))
		}
		if o.Err != nil {
			span.RecordError(o.Err)
			span.SetStatus(codes.Error, o.Err.Error())
		}
	}
	span.End()
}
