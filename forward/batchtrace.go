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

// A fast batch gets one publish span, not one per event: a "send" span of
// kind producer for all its messages, as the OpenTelemetry messaging
// conventions allow for batch sending. Each message still carries a
// traceparent, its creation context:
//
//   - an event whose meta holds a valid trace context (the app's) carries
//     that context unchanged, and the batch span links to it (the
//     conventions: a creation context the user provides is not modified);
//   - every other event carries the batch span's context, so its
//     deliveries hang under the batch span, in the batch's trace.
//
// Per-event spans cost the SDK about 40 allocations and 4.5 KB per event
// drained; the batch span costs that once per batch (up to FetchLimit
// events), and an event without a trace context of its own shares the
// batch span's header value (no allocation).

// batchSpan is one fast batch's publish span and its context as header
// values.
type batchSpan struct {
	span trace.Span
	// parent and state are the span's traceparent and tracestate header
	// values, shared by every message without its own context; nil when
	// the span's context is not valid (tracing off): such messages carry
	// no trace headers.
	parent, state []string
	// own holds the trace context of each event from its meta (invalid
	// when none); nil when no event has one.
	own []trace.SpanContext
}

// startBatchSpan starts the publish span of evs, a fast batch of stream,
// linked to the trace contexts in the events' meta.
func (f *Forwarder) startBatchSpan(ctx context.Context, stream string, evs []event.Event) *batchSpan {
	bs := &batchSpan{}
	var links []trace.Link
	for i := range evs {
		if evs[i].Meta.TraceParent == "" {
			continue
		}
		sc := trace.SpanContextFromContext(tracing.Propagator.Extract(context.Background(), metaCarrier{&evs[i].Meta}))
		if !sc.IsValid() {
			continue
		}
		if bs.own == nil {
			bs.own = make([]trace.SpanContext, len(evs))
		}
		bs.own[i] = sc
		links = append(links, trace.Link{SpanContext: sc})
	}
	opts := []trace.SpanStartOption{producerKind}
	if len(links) > 0 {
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, bs.span = f.tracer.Start(ctx, f.spanName, opts...)
	if bs.span.IsRecording() {
		bs.span.SetAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", wire.StreamFilter(f.cfg.Prefix, stream)),
			attribute.Int("messaging.batch.message_count", len(evs)),
			tracing.AttrStream.String(stream),
			tracing.AttrStreamVersion.Int64(evs[0].Version),
			tracing.AttrFirstEventID.String(event.FormatID(evs[0].ID)),
			tracing.AttrLastEventID.String(event.FormatID(evs[len(evs)-1].ID)),
		)
	}
	if bs.span.SpanContext().IsValid() {
		h := nats.Header{}
		tracing.Propagator.Inject(ctx, tracing.HeaderCarrier(h))
		bs.parent, bs.state = h[wire.HeaderTraceParent], h[wire.HeaderTraceState]
	}
	return bs
}

// inject writes the trace context of evs[i] into h: its own (from its
// meta) when valid, else the batch span's; none when neither is valid.
func (bs *batchSpan) inject(h nats.Header, evs []event.Event, i int) {
	if bs.own != nil && bs.own[i].IsValid() {
		tracing.Propagator.Inject(trace.ContextWithRemoteSpanContext(context.Background(), bs.own[i]), tracing.HeaderCarrier(h))
		return
	}
	if bs.parent != nil {
		h[wire.HeaderTraceParent] = bs.parent
		if bs.state != nil {
			h[wire.HeaderTraceState] = bs.state
		}
	}
}

// end ends the span with the batch's result r of n events: stored when all
// were, else failed with r.Err; jsbridge.publish.stored counts the events
// stored, messaging.nats.jetstream.sequence is the last one's sequence.
func (bs *batchSpan) end(r batchResult, n int) {
	if bs.span.IsRecording() {
		status := Stored
		if r.Done < n {
			status = Failed
		}
		bs.span.SetAttributes(tracing.AttrPublishStatus.String(status.String()), tracing.AttrPublishStored.Int(r.Done))
		if r.Sequence != 0 {
			bs.span.SetAttributes(attribute.Int64("messaging.nats.jetstream.sequence", int64(r.Sequence)))
		}
		if r.Err != nil {
			bs.span.RecordError(r.Err)
			bs.span.SetStatus(codes.Error, r.Err.Error())
		}
	}
	bs.span.End()
}
