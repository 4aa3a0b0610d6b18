package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/tracing"
)

// Tracing (OpenTelemetry, W3C Trace Context): every attempt gets a span of
// kind client named "deliver <subscription>", whose parent is the trace
// context in the message's traceparent/tracestate headers (the bridge's
// publish span), so every attempt of an event hangs under the same publish
// in the event's trace. Its attributes: jsbridge.subscription,
// jsbridge.attempt, jsbridge.outcome, jsbridge.status_class,
// jsbridge.breaker.state, http.response.status_code (when there was a
// response), messaging.message.id (the event id) and url.full (the
// endpoint as breaker.Endpoint renders it: no userinfo, query or fragment,
// so no secret a URL may carry leaks into traces).
// The POST carries the span's context in its traceparent header, so the
// receiver's spans continue the trace too.
//
// After the span ends, the attempt is handed to Config.Attempts (the
// attempts record, see attemptlog.Log), which must not block.

// attemptState follows one attempt through handle, for its span and its
// record. The outcome is set where handle (or giveUp) decides it.
type attemptState struct {
	span    trace.Span
	attempt int
	id      string
	msg     jetstream.Msg
	began   time.Time
	sent    time.Time // when the breaker was asked (zero: nothing sent)
	took    time.Duration
	resp    response
	hasResp bool
	outcome string
	class   string
	reason  string
}

type attemptKey struct{}

// startAttempt starts the attempt's span as a child of the message's trace
// context and returns the context carrying both.
func (r *runner) startAttempt(ctx context.Context, msg jetstream.Msg, id string, attempt int) (context.Context, *attemptState) {
	st := &attemptState{attempt: attempt, id: id, msg: msg, began: time.Now()}
	if h := msg.Headers(); len(h) > 0 {
		ctx = tracing.Propagator.Extract(ctx, tracing.HeaderCarrier(h))
	}
	ctx, st.span = r.tracer.Start(ctx, r.spanName, trace.WithSpanKind(trace.SpanKindClient))
	return context.WithValue(ctx, attemptKey{}, st), st
}

// attemptOf returns the attempt ctx carries, or nil.
func attemptOf(ctx context.Context) *attemptState {
	st, _ := ctx.Value(attemptKey{}).(*attemptState)
	return st
}

// decide records how the attempt ended (the label values of
// jsbridge_consumer_deliveries_total) and, for a failure, why.
func (st *attemptState) decide(outcome, class, reason string) {
	if st != nil {
		st.outcome, st.class, st.reason = outcome, class, reason
	}
}

// sending marks the moment the attempt went to the breaker.
func (st *attemptState) sending() { st.sent = time.Now() }

// answered keeps the response of the POST.
func (st *attemptState) answered(resp response) {
	st.resp, st.hasResp = resp, true
	if !st.sent.IsZero() {
		st.took = time.Since(st.sent)
	}
}

// endAttempt ends the span and hands the attempt to the attempts record.
func (r *runner) endAttempt(st *attemptState) {
	state := r.br.State().String()
	if st.outcome == "" {
		// handle returned without deciding (a panic unwinding): say so.
		st.outcome, st.class = "unknown", ClassNone
	}
	if span := st.span; span.IsRecording() {
		span.SetAttributes(
			tracing.AttrSubscription.String(r.sub.Name),
			tracing.AttrAttempt.Int(st.attempt),
			tracing.AttrOutcome.String(st.outcome),
			tracing.AttrStatusClass.String(st.class),
			tracing.AttrBreakerState.String(state),
			attribute.String("messaging.message.id", st.id),
			attribute.String("url.full", r.endpoint),
		)
		if st.hasResp && st.resp.status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", st.resp.status))
		}
		if st.outcome != OutcomeAck {
			span.SetStatus(codes.Error, st.reason)
		}
	}
	st.span.End()
	if r.attempts == nil {
		return
	}
	a := attemptlog.Attempt{
		Subscription: r.sub.Name,
		EventID:      st.id,
		Attempt:      st.attempt,
		At:           st.began.UTC(),
		Outcome:      st.outcome,
		StatusClass:  st.class,
		Breaker:      state,
		Error:        st.reason,
		Subject:      st.msg.Subject(),
	}
	if !st.sent.IsZero() && st.hasResp {
		a.At = st.resp.at.UTC()
		a.Status = st.resp.status
		a.Latency = st.took
	}
	if a.At.IsZero() {
		a.At = st.began.UTC()
	}
	if md, err := st.msg.Metadata(); err == nil {
		a.StreamSeq = md.Sequence.Stream
	}
	if sc := st.span.SpanContext(); sc.HasTraceID() {
		a.TraceID = sc.TraceID().String()
	}
	r.attempts.RecordAttempt(a)
}

// spanName is the name of a subscription's attempt spans.
func spanName(subscription string) string { return "deliver " + subscription }
