package attempt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/payload"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/throttle"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Sender makes one subscription's attempts: it builds the webhook, signs
// it, POSTs it through the endpoint's circuit breaker with the attempt's
// span and record, and counts the outcome. The unordered runner and the
// ordered partitions share it; it knows nothing of either. It is safe for
// concurrent use.
type Sender struct {
	sub subscription.Subscription
	// signer signs every request; swapped whole when the subscription's
	// secrets change at runtime (SetSigner), so the next attempt signs
	// with the new ones.
	signer atomic.Pointer[webhook.Signer]
	// replica is the Jsbridge-Replica value last sent (replicaValue).
	replica atomic.Pointer[[]string]
	client  *http.Client
	// ep is the parsed Subscription.URL and how POSTs reach it
	// (endpoint.go).
	ep       endpoint
	br       Breaker
	endpoint string
	log      *slog.Logger
	// static are the request headers every delivery carries (see
	// requestHeader).
	static http.Header
	// tracer and spanName make the attempt spans (trace.go).
	tracer   trace.Tracer
	spanName string
	// clock measures and signs the POSTs (Deps.Archetype).
	clock clockwork.Clock
	// health is the subscriptions' disabled state; throttle the
	// subscription's rate limit.
	health     Health
	throttle   *throttle.Throttle
	deliveries *prometheus.CounterVec
	attempts   attemptlog.Recorder // nil: no records
	// record says which attempts go to attempts (Deps.Record).
	record   attemptlog.Mode
	duration prometheus.Observer
	// acked2xx is deliveries{outcome="ack",status_class="2xx"}, resolved
	// on first use so that no zero series shows before the first ack.
	acked2xx func() prometheus.Counter
}

// SetSigner makes the next attempts sign with signer (the subscription's
// secrets or scheme changed at runtime).
func (r *Sender) SetSigner(signer *webhook.Signer) { r.signer.Store(signer) }

// Subscription is the subscription the Sender delivers.
func (r *Sender) Subscription() subscription.Subscription { return r.sub }

// Endpoint is the endpoint as logs, spans and dead letters name it
// (breaker.Endpoint: no userinfo, query or fragment).
func (r *Sender) Endpoint() string { return r.endpoint }

// Logger is the Sender's logger, with the subscription and endpoint.
func (r *Sender) Logger() *slog.Logger { return r.log }

// Direct POSTs the webhook of event id (the message's headers h and
// data) once, as an attempt does but outside the circuit breaker, with no
// span, record, throttle or health: a replay's POST. order, when not
// nil, is the webhook's place in its stream's version chain, signed.
// The error says why the event cannot become a webhook (no event id, a
// malformed attribute or body).
func (r *Sender) Direct(ctx context.Context, id string, h nats.Header, data []byte, order *webhook.OrderFields) (Response, error) {
	if id == "" {
		return Response{}, errNoEventID
	}
	hdr := r.requestHeader(order != nil, len(h))
	body, err := payload.Build(r.sub.Body, id, h, data, nil, hdr)
	if err != nil {
		return Response{}, err
	}
	return r.post(ctx, id, body, hdr, order), nil
}

// request builds the webhook of msg (event id id): its headers (the
// subscription's, Jsbridge-Replica when replica is not "", the body's;
// ordered: room for the version chain's) and body. An error means msg cannot become a webhook (no event id, a
// malformed attribute or body): the settlers dead-letter it, OutcomeTerm.
func (r *Sender) request(msg reader.Event, id, replica string, ordered bool) ([]byte, http.Header, error) {
	if id == "" {
		return nil, nil, errNoEventID
	}
	hdr := r.requestHeader(ordered, len(msg.Header))
	if replica != "" {
		hdr[wire.HeaderReplica] = r.replicaValue(replica)
	}
	body, err := payload.Build(r.sub.Body, id, msg.Header, msg.Data, msg.Envelope, hdr)
	if err != nil {
		return nil, nil, err
	}
	return body, hdr, nil
}

// send POSTs the request through the endpoint's circuit breaker and
// records what happened on at (the attempt's span and record). notSent
// is nil when the POST went out; else it says why nothing was sent, and
// resp is the zero Response: an error wrapping breaker.ErrOpen when the
// breaker let nothing through (open, or a half-open probe already
// running), or ErrLeasePassed when fence refused it. gen is what
// Gate returned; order, as for post.
//
// fence, when not nil (Call.Fence), is asked once the breaker let the
// POST through, probe claim included,
// right before the POST: it refuses a POST past the lease deadline and
// bounds the POST's context by the lease (a POST cut there, or failed
// once the lease had passed, answers with an error wrapping
// ErrLeasePassed, and counts for neither the breaker nor the
// subscription's health).
func (r *Sender) send(ctx context.Context, at *Trace, fence PostFence, gen uint64, id string, body []byte, hdr http.Header, order *webhook.OrderFields) (resp Response, notSent error) {
	at.sending(r.clock.Now())
	var fenced error
	err := r.br.Execute(func() error {
		pctx := ctx
		var end func() bool
		if fence != nil {
			fctx, e, err := fence(ctx)
			if err != nil {
				fenced = err
				return fmt.Errorf("%w: %w", breaker.ErrExcluded, err)
			}
			pctx, end = fctx, e
		}
		resp = r.post(pctx, id, body, hdr, order)
		passed := end != nil && end()
		if resp.Err != nil && (passed || (end != nil && errors.Is(context.Cause(pctx), ErrLeasePassed))) {
			// Cut by the lease, not the endpoint's failure: also a POST
			// that failed once the lease had passed, its own timeout
			// having fired before the fence's cut (a freeze ended).
			resp.Err = fmt.Errorf("%w: %w", ErrLeasePassed, resp.Err)
			at.answered(resp, r.clock.Now())
			return fmt.Errorf("%w: %w", breaker.ErrExcluded, resp.Err)
		}
		at.answered(resp, r.clock.Now())
		return resp.breakerErr()
	})
	if fenced != nil {
		return Response{}, fenced
	}
	if errors.Is(err, breaker.ErrOpen) {
		return resp, err
	}
	if !errors.Is(resp.Err, ErrLeasePassed) {
		r.answered(resp, gen)
	}
	return resp, nil
}

// PostFence is where a POST passes an ordered partition's lease fence
// (Call.Fence): ctx bounded by the lease and end, called once the POST
// ended, which reports whether the lease had passed by then (a POST
// that failed then counts as cut); or why the POST may not start (an
// error wrapping ErrLeasePassed).
type PostFence func(ctx context.Context) (context.Context, func() (passed bool), error)

// answered feeds an answer to the throttle (a 429 or 503 cuts the rate;
// gen is the throttle's generation when the request was sent)
// and to the subscription's health: a 410 disables it at once, a failure
// streak past health.Config.DisableAfter disables it, a 2xx ends the
// streak.
func (r *Sender) answered(resp Response, gen uint64) {
	r.throttle.Observe(gen, throttle.Answer{Accepted: resp.Err == nil && resp.Status/100 == 2,
		Throttled: resp.Verdict() == VerdictThrottle, RetryAfter: min(resp.RetryAfter, MaxRetryAfter)})
	switch resp.Verdict() {
	case VerdictAck:
		r.health.Succeeded(r.sub.Name)
	case VerdictGone:
		r.health.Disable(context.Background(), r.disabledRecord(health.ReasonGone, resp))
	case VerdictRetry:
		if r.health.Failed(r.sub.Name) {
			r.health.Disable(context.Background(), r.disabledRecord(health.ReasonFailing, resp))
		}
	}
}

// disabledRecord is the record of disabling the subscription for reason
// after resp.
func (r *Sender) disabledRecord(reason string, resp Response) health.DisabledRecord {
	return health.DisabledRecord{Subscription: r.sub.Name, Endpoint: r.endpoint, Reason: reason, Status: resp.Status, LastError: resp.Reason()}
}

// Gate waits until the subscription may POST: while it is disabled, and
// for its throttle (rate, Retry-After). It returns the throttle's
// generation for send, or ctx's error if ctx ends first.
func (r *Sender) Gate(ctx context.Context) (uint64, error) {
	if r.health.IsDisabled(r.sub.Name) {
		if err := r.health.WaitEnabled(ctx, r.sub.Name); err != nil {
			return 0, err
		}
	}
	return r.throttle.Wait(ctx)
}

// Count counts one attempt's outcome in
// jsbridge_consumer_deliveries_total; status is the HTTP status of an ack.
func (r *Sender) Count(outcome, class string, status int) {
	if outcome == OutcomeAck && status/100 == 2 {
		r.acked2xx().Inc()
		return
	}
	r.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
}

// requestHeader returns a new request header holding the subscription's
// static headers (Subscription.Headers, User-Agent, Accept-Encoding),
// with room for the per-delivery ones; in binary mode also for the
// event's CloudEvents attributes (at most attrs, its message's header
// count), so that the map is made at its size once rather than grown. The
// static values are shared between requests: the transport only reads
// them, and every header set per delivery (see reservedHeaders) replaces
// a value rather than appending to it.
func (r *Sender) requestHeader(ordered bool, attrs int) http.Header {
	room := perDelivery
	if ordered {
		room += perOrdered
	}
	if r.sub.Body == subscription.BodyBinary {
		room += attrs
	}
	h := make(http.Header, len(r.static)+room)
	for k, v := range r.static {
		h[k] = v
	}
	return h
}

// replicaValue returns replica as a header value, made once and shared
// by the requests (the transport only reads it; the replica's id does
// not change).
func (r *Sender) replicaValue(replica string) []string {
	if v := r.replica.Load(); v != nil && (*v)[0] == replica {
		return *v
	}
	v := []string{replica}
	r.replica.Store(&v)
	return v
}

// perDelivery is the room requestHeader leaves for the headers of one
// delivery: an unordered structured-mode webhook's (Content-Type,
// Idempotency-Key, Jsbridge-Replica, the three Standard Webhooks
// headers), so that with User-Agent and Accept-Encoding they fill one
// map group of 8 and the map is one small allocation (a hint past 8
// allocates a table of 16); an ordered webhook's version chain adds
// perOrdered more, and its map is sized for them at once rather than
// grown.
const (
	perDelivery = 6
	perOrdered  = 4
)

// post sends one signed POST and reads the response. hdr comes from
// requestHeader and payload.Build. order, when not nil, is an
// ordered webhook's place in its stream's version chain: its headers
// (Jsbridge-Previous-Version, and Jsbridge-Partition and
// Jsbridge-Lease-Epoch from a partition's owner) and the order signature
// are set with the same timestamp as the signature.
func (r *Sender) post(ctx context.Context, id string, body []byte, hdr http.Header, order *webhook.OrderFields) Response {
	ctx, cancel := context.WithTimeout(ctx, r.sub.Timeout)
	defer cancel()

	hdr[wire.HeaderIdempotencyKey] = []string{wire.IdempotencyKey(id)}
	// net/http takes a request with Idempotency-Key for idempotent and
	// re-sends it by itself on a broken connection, rewinding the body
	// with GetBody: a re-send past the lease check (a replica waking from
	// a freeze). newRequest sets no GetBody: only a request whose body was
	// never read is re-sent; anything else comes back here as an error and
	// is retried through the lease check.
	req := r.ep.newRequest(ctx, hdr, body)
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(hdr)) // traceparent: the attempt's span
	signer, now := r.signer.Load(), r.clock.Now()
	signer.Sign(hdr, id, now, body)
	if order != nil {
		signer.SignOrder(hdr, id, now, *order)
	}

	start := r.clock.Now()
	resp, err := r.ep.do(r.client, req)
	if err != nil {
		r.duration.Observe(r.clock.Since(start).Seconds())
		var ne net.Error
		timeout := !errors.Is(err, egress.ErrForbiddenAddress) && (errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()))
		return Response{Err: err, Timeout: timeout, RetryAfter: -1, At: start}
	}
	// Drain (a little of) the body so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	r.duration.Observe(r.clock.Since(start).Seconds())
	out := Response{Status: resp.StatusCode, RetryAfter: ParseRetryAfter(resp.Header.Get("Retry-After"), r.clock.Now()), At: start}
	if resp.StatusCode == http.StatusConflict {
		out.Order = resp.Header.Get(wire.HeaderOrder)
		out.OrderEpoch, _ = strconv.ParseUint(resp.Header.Get(wire.HeaderOrderEpoch), 10, 64) // absent or bad: 0, the epoch is doubled
		out.OrderLast = resp.Header.Get(wire.HeaderOrderLast)
	}
	return out
}

// start starts the attempt's span as a child of the message's trace
// context and returns the context carrying the span, and the attempt.
func (r *Sender) start(ctx context.Context, msg reader.Event, id string, attempt int) (context.Context, *Trace) {
	st := &Trace{attempt: attempt, id: id, seq: msg.Seq, subject: msg.Subject, began: r.clock.Now()}
	if h := msg.Header; len(h) > 0 {
		if sc, ok := msg.Envelope.Parent(func() any { return remoteParent(h) }).(trace.SpanContext); ok {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	ctx, st.span = r.tracer.Start(ctx, r.spanName, clientKind)
	return ctx, st
}

// remoteParent returns the valid span context h carries as
// tracing.Propagator extracts it (W3C Trace Context: traceparent,
// tracestate), or nil. The event's webhooks share it (reader.Envelope),
// so an event's headers are searched once, not once a webhook.
func remoteParent(h nats.Header) any {
	sc := trace.SpanContextFromContext(tracing.Propagator.Extract(context.Background(), tracing.HeaderCarrier(h)))
	if !sc.IsValid() {
		return nil
	}
	return sc
}

// End ends the span and hands the attempt to the attempts record when
// its mode keeps it (keeps): under attemptlog.ModeFailures a success on
// the first attempt is counted (Count), not recorded.
func (r *Sender) End(st *Trace) {
	if st == nil {
		return
	}
	if st.outcome == "" {
		// handle returned without deciding (a panic unwinding): say so.
		st.outcome, st.class = "unknown", ClassNone
	}
	recording := st.span.IsRecording()
	kept := r.attempts != nil && keeps(r.record, st.outcome, st.attempt, st.afterFailure)
	if !recording && !kept {
		st.span.End()
		return // no span attribute nor record reads the breaker's state: not taken (its lock, the clock)
	}
	state := r.br.State().String()
	if span := st.span; recording {
		span.SetAttributes(
			tracing.AttrSubscription.String(r.sub.Name),
			tracing.AttrAttempt.Int(st.attempt),
			tracing.AttrOutcome.String(st.outcome),
			tracing.AttrStatusClass.String(st.class),
			tracing.AttrBreakerState.String(state),
			attribute.String("messaging.message.id", st.id),
			attribute.String("url.full", r.endpoint),
		)
		if st.hasResp && st.resp.Status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", st.resp.Status))
		}
		if st.outcome != OutcomeAck {
			span.SetStatus(codes.Error, st.reason)
		}
	}
	st.span.End()
	if !kept {
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
		Subject:      st.subject,
		StreamSeq:    st.seq,
	}
	if !st.sent.IsZero() && st.hasResp {
		a.At = st.resp.At.UTC()
		a.Status = st.resp.Status
		a.Latency = st.took
	}
	if a.At.IsZero() {
		a.At = st.began.UTC()
	}
	if sc := st.span.SpanContext(); sc.HasTraceID() {
		a.TraceID = sc.TraceID().String()
	}
	r.attempts.RecordAttempt(a)
}

// keeps reports whether mode keeps the record of an attempt that ended
// with outcome, numbered attempt (1-based), afterFailure saying whether an
// earlier attempt of the same delivery failed without spending an
// attempt number (Call.AfterFailure): every attempt under
// attemptlog.ModeAll; under attemptlog.ModeFailures every attempt but a
// success (OutcomeAck) on the first attempt with no failure before it, so
// that a series with a failure is recorded whole, its last success
// included. A pure function of its arguments.
func keeps(mode attemptlog.Mode, outcome string, attempt int, afterFailure bool) bool {
	return mode == attemptlog.ModeAll || outcome != OutcomeAck || attempt > 1 || afterFailure
}
