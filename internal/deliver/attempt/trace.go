package attempt

import (
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (OpenTelemetry, W3C Trace Context): every attempt gets a span of
// kind client named "deliver <subscription>", whose parent is the trace
// context in the message's traceparent/tracestate headers (the bridge's
// publish span), so every attempt of an event hangs under the same publish
// in the event's trace. Its attributes: jsbridge.subscription,
// jsbridge.attempt, jsbridge.outcome, jsbridge.status_class,
// jsbridge.breaker.state, http.response.status_code (when there was a
// Response), messaging.message.id (the event id) and url.full (the
// endpoint as breaker.Endpoint renders it: no userinfo, query or fragment,
// so no secret a URL may carry leaks into traces).
// The POST carries the span's context in its traceparent header, so the
// receiver's spans continue the trace too.
//
// After the span ends, the attempt is handed to Deps.Attempts (the
// attempts record, see attemptlog.Log), which must not block, unless
// Deps.Record leaves it out (a success on the first attempt under
// attemptlog.ModeFailures, the default).

// Trace follows one attempt from Attempt to End, for its span and its
// record: Attempt decides it with the settlement's outcome, a settler
// whose act failed decides it again (Decide) before End.
type Trace struct {
	span    trace.Span
	attempt int
	// afterFailure is Call.AfterFailure: the attempt ends a series with a
	// failure in it (see keeps).
	afterFailure bool
	id           string
	seq          uint64 // the event's sequence and subject, for the record
	subject      string
	began        time.Time
	sent         time.Time // when the breaker was asked (zero: nothing sent)
	took         time.Duration
	resp         Response
	hasResp      bool
	outcome      string
	class        string
	reason       string
}

// clientKind is the attempt spans' kind, made once: trace.WithSpanKind
// allocates on every call.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// Decide records how the attempt ended (the label values of
// jsbridge_consumer_deliveries_total) and, for a failure, why.
func (st *Trace) Decide(outcome, class, reason string) {
	if st != nil {
		st.outcome, st.class, st.reason = outcome, class, reason
	}
}

// sending marks the moment (now) the attempt went to the breaker.
func (st *Trace) sending(now time.Time) { st.sent = now }

// answered keeps the response of the POST, answered at now.
func (st *Trace) answered(resp Response, now time.Time) {
	st.resp, st.hasResp = resp, true
	if !st.sent.IsZero() {
		st.took = now.Sub(st.sent)
	}
}

// spanName is the name of a subscription's attempt spans.
func spanName(subscription string) string { return "deliver " + subscription }

// EndNotSent ends an attempt that a PostFence stopped before its POST:
// its span ends with why, and nothing is counted or recorded (no POST,
// no outcome).
func (st *Trace) EndNotSent(why error) {
	st.span.SetStatus(codes.Error, "not sent: "+why.Error())
	st.span.End()
}
