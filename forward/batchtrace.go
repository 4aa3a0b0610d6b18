package forward

import (
	"context"
	"strings"

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
// events), an event without a trace context of its own shares the batch
// span's header value, and one with its own costs the propagator's
// extraction (two allocations).

// batchSpan is one fast batch's publish span and the trace headers of its
// messages.
type batchSpan struct {
	span trace.Span
	// parent and state are the span's traceparent and tracestate header
	// values, shared by every message without its own context; nil when
	// the span's context is not valid (tracing off): such messages carry
	// no trace headers.
	parent, state []string
	// own holds, per event, the traceparent and tracestate header values
	// of the trace context in its meta (parent nil when it has no valid
	// one); nil when no event has one.
	own []ownContext
}

// ownContext is the header values of an event's own trace context.
type ownContext struct{ parent, state []string }

// startBatchSpan starts the publish span of evs, a fast batch of stream,
// linked to the trace contexts in the events' meta, and works out each
// message's trace headers.
func (f *Forwarder) startBatchSpan(ctx context.Context, stream string, evs []event.Event) *batchSpan {
	bs := &batchSpan{}
	var links []trace.Link
	var parents []string // one backing array for the events' own traceparents
	for i := range evs {
		m := &evs[i].Meta
		if m.TraceParent == "" {
			continue
		}
		sc := trace.SpanContextFromContext(tracing.Propagator.Extract(context.Background(), metaCarrier{m}))
		if !sc.IsValid() {
			continue
		}
		if bs.own == nil {
			bs.own, parents = make([]ownContext, len(evs)), make([]string, len(evs))
		}
		parents[i] = m.TraceParent
		if !strings.HasPrefix(m.TraceParent, "00-") {
			// A later version: sent as version 00, as the propagator
			// writes it. A valid version 00 value is already that.
			parents[i] = injected(sc)[wire.HeaderTraceParent][0]
		}
		bs.own[i].parent = parents[i : i+1 : i+1]
		if ts := sc.TraceState().String(); ts != "" {
			bs.own[i].state = []string{ts}
		}
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
	if sc := bs.span.SpanContext(); sc.IsValid() {
		h := injected(sc)
		bs.parent, bs.state = h[wire.HeaderTraceParent], h[wire.HeaderTraceState]
	}
	return bs
}

// injected returns the trace headers the W3C propagator writes for sc.
func injected(sc trace.SpanContext) nats.Header {
	h := nats.Header{}
	tracing.Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), tracing.HeaderCarrier(h))
	return h
}

// inject writes the trace headers of evs[i] into h: its own context's
// (from its meta) when valid, else the batch span's; none when neither is
// valid. It allocates nothing.
func (bs *batchSpan) inject(h nats.Header, i int) {
	parent, state := bs.parent, bs.state
	if bs.own != nil && bs.own[i].parent != nil {
		parent, state = bs.own[i].parent, bs.own[i].state
	}
	if parent != nil {
		h[wire.HeaderTraceParent] = parent
	}
	if state != nil {
		h[wire.HeaderTraceState] = state
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
