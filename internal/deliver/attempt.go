package deliver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// sender makes one subscription's attempts: it builds the webhook, signs
// it, POSTs it through the endpoint's circuit breaker with the attempt's
// span and record, and counts the outcome. The unordered runner and the
// ordered partitions share it.
type sender struct {
	sub subscription.Subscription
	// signer signs every request; swapped whole when the subscription's
	// secrets change at runtime (Fleet), so the next attempt signs with
	// the new ones.
	signer atomic.Pointer[webhook.Signer]
	client *http.Client
	// ep is the parsed Subscription.URL and how POSTs reach it
	// (roundtrip.go).
	ep       endpoint
	br       *breaker.Breaker
	endpoint string
	log      *slog.Logger
	// static are the request headers every delivery carries (see
	// requestHeader).
	static http.Header
	// tracer and spanName make the attempt spans (trace.go).
	tracer   trace.Tracer
	spanName string
	clock    clockwork.Clock
	// health is the subscriptions' disabled state (nil: always enabled);
	// throttle the subscription's rate limit (nil: none).
	health   *health.State
	throttle *throttle
	metrics  *metrics
	attempts attemptlog.Recorder // nil: no records
	duration prometheus.Observer
	// acked2xx is deliveries{outcome="ack",status_class="2xx"}, resolved
	// on first use so that no zero series shows before the first ack.
	acked2xx func() prometheus.Counter
}

// One attempt, one path: both settlers, runner.handle (unordered: ack, Nak
// with a delay, dead letter) and headOfLine.deliver (ordered: ack, retry in
// place, dead letter and park), build the request with request, send it
// with send and read what the response means for the message from settlementOf.
// What each does with the message afterwards is its own.

// act is what a settler does with the message after an attempt.
type act int

const (
	actAck        act = iota // 2xx: ack
	actRetry                 // retryable and attempts left: try again after delay
	actDeadLetter            // permanent, or retryable on the last attempt: dead-letter
	// actWait: the receiver's order gate refused the event for now (gap,
	// in-progress): try again after delay; no attempt spent, never
	// dead-lettered.
	actWait
	// actStale: the receiver's order gate processed the stream under a
	// later lease epoch: this replica's lease is stale. An ordered
	// partition stops (released; nothing acked, nothing dead-lettered);
	// an unordered settler, whose webhooks carry no epoch, waits.
	actStale
	// actThrottle: the endpoint asked to slow down (verdictThrottle): the
	// throttle was cut; try again in place after delay (Retry-After, the
	// throttle waits for it too); no attempt spent, never dead-lettered.
	actThrottle
	// actDisable: 410 Gone: the subscription is disabled (package health); the
	// event waits in place until it is enabled; no attempt spent, nothing
	// dead-lettered.
	actDisable
)

// OrderWaitDelay is the delay before an event refused by a receiver's
// order gate (409 gap or in-progress) is sent again when the answer has no
// Retry-After; a Retry-After is honoured up to MaxOrderWait.
const (
	OrderWaitDelay = 200 * time.Millisecond
	MaxOrderWait   = 5 * time.Second
)

// settlement is what one attempt's response means for its message, by the
// webhook contract (response.verdict) with MaxDeliver and the backoff
// applied: the act, the outcome and status_class labels, the reason ("" when
// acked) and, for actRetry, the delay before the next attempt.
type settlement struct {
	act     act
	outcome string
	class   string
	reason  string
	delay   time.Duration
}

// settlementOf decides what resp, the answer to attempt (1-based) of a
// subscription with maxDeliver attempts (-1 or 0: no limit) and backOff,
// means for its message. A pure function of its arguments.
func settlementOf(resp response, attempt, maxDeliver int, backOff []time.Duration) settlement {
	class := resp.class()
	switch resp.verdict() {
	case verdictAck:
		return settlement{act: actAck, outcome: OutcomeAck, class: class}
	case verdictPermanent:
		return settlement{act: actDeadLetter, outcome: OutcomeTerm, class: class, reason: resp.reason()}
	case verdictOrderWait:
		return settlement{act: actWait, outcome: OutcomeRetry, class: class, reason: resp.reason(), delay: orderWait(resp.retryAfter)}
	case verdictStaleEpoch:
		return settlement{act: actStale, outcome: OutcomeStaleEpoch, class: class, reason: resp.reason(), delay: orderWait(resp.retryAfter)}
	case verdictThrottle:
		return settlement{act: actThrottle, outcome: OutcomeThrottled, class: class, reason: resp.reason(), delay: max(resp.retryAfter, 0)}
	case verdictGone:
		return settlement{act: actDisable, outcome: OutcomeDisabled, class: class, reason: resp.reason()}
	}
	if maxDeliver > 0 && attempt >= maxDeliver {
		return settlement{act: actDeadLetter, outcome: OutcomeExhausted, class: class,
			reason: fmt.Sprintf("%s (attempt %d of MaxDeliver %d)", resp.reason(), attempt, maxDeliver)}
	}
	return settlement{act: actRetry, outcome: OutcomeRetry, class: class, reason: resp.reason(), delay: retryDelay(backOff, attempt, resp.retryAfter)}
}

// orderWait is the delay before an event an order gate refused is sent
// again: Retry-After capped at MaxOrderWait, else OrderWaitDelay.
func orderWait(retryAfter time.Duration) time.Duration {
	if retryAfter >= 0 {
		return min(retryAfter, MaxOrderWait)
	}
	return OrderWaitDelay
}

// retryDelay is the delay before the attempt after attempt: Retry-After when
// the endpoint sent one (capped at MaxRetryAfter), else backOff[attempt-1],
// the last entry repeating.
func retryDelay(backOff []time.Duration, attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter >= 0 {
		return min(retryAfter, MaxRetryAfter)
	}
	i := min(max(attempt-1, 0), len(backOff)-1)
	return backOff[i]
}

// errNoEventID is the reason a message without an event id is
// dead-lettered.
var errNoEventID = errors.New("message has no Nats-Msg-Id or ce-id")

// attemptNumber is msg's attempt, 1-based: JetStream's delivery count.
func attemptNumber(msg jetstream.Msg) int {
	if md, err := msg.Metadata(); err == nil {
		return int(md.NumDelivered)
	}
	return 1
}

// request builds the webhook of msg (event id id): its headers (the
// subscription's, Jsbridge-Replica when replica is not "", the body's) and
// body. An error means msg cannot become a webhook (no event id, a
// malformed attribute or body): the settlers dead-letter it, OutcomeTerm.
func (r *sender) request(msg jetstream.Msg, id, replica string) ([]byte, http.Header, error) {
	if id == "" {
		return nil, nil, errNoEventID
	}
	hdr := r.requestHeader()
	if replica != "" {
		hdr.Set(wire.HeaderReplica, replica)
	}
	body, err := buildBody(r.sub.Body, id, msg.Headers(), msg.Data(), hdr)
	if err != nil {
		return nil, nil, err
	}
	return body, hdr, nil
}

// send POSTs the request through the endpoint's circuit breaker and
// records what happened on at (the attempt's span and record). notSent
// is nil when the POST went out; else it says why nothing was sent, and
// resp is the zero response: an error wrapping breaker.ErrOpen when the
// breaker let nothing through (open, or a half-open probe already
// running), or errLeasePassed when fence refused it. inProgress, when
// not nil, is called every AckWait/2 while the POST runs. gen is what
// gate returned; order, as for post.
//
// fence, when not nil (an ordered partition's leaseFence.bound), is
// asked once the breaker let the POST through, probe claim included,
// right before the POST: it refuses a POST past the lease deadline and
// bounds the POST's context by the lease (a POST cut there answers with
// an error wrapping errLeasePassed, and counts for neither the breaker
// nor the subscription's health).
func (r *sender) send(ctx context.Context, at *attemptState, inProgress func() error, fence postFence, gen uint64, id string, body []byte, hdr http.Header, order *webhook.OrderFields) (resp response, notSent error) {
	at.sending()
	var fenced error
	err := r.br.Execute(func() error {
		pctx := ctx
		if fence != nil {
			fctx, done, err := fence(ctx)
			if err != nil {
				fenced = err
				return fmt.Errorf("%w: %w", breaker.ErrExcluded, err)
			}
			defer done()
			pctx = fctx
		}
		resp = r.post(pctx, inProgress, id, body, hdr, order)
		if cause := context.Cause(pctx); fence != nil && errors.Is(cause, errLeasePassed) && resp.err != nil {
			// Cut by the lease, not the endpoint's failure.
			resp.err = fmt.Errorf("%w: %w", cause, resp.err)
			at.answered(resp)
			return fmt.Errorf("%w: %w", breaker.ErrExcluded, resp.err)
		}
		at.answered(resp)
		return resp.breakerErr()
	})
	if fenced != nil {
		return response{}, fenced
	}
	if errors.Is(err, breaker.ErrOpen) {
		return resp, err
	}
	if !errors.Is(resp.err, errLeasePassed) {
		r.answered(resp, gen)
	}
	return resp, nil
}

// postFence is where a POST passes its partition's lease fence
// (leaseFence.bound): ctx bounded by the lease and its cancel, or why
// the POST may not start.
type postFence func(ctx context.Context) (context.Context, context.CancelFunc, error)

// answered feeds an answer to the throttle (a 429 or 503 cuts the rate;
// gen is the throttle's generation when the request was sent)
// and to the subscription's health: a 410 disables it at once, a failure
// streak past health.Config.DisableAfter disables it, a 2xx ends the
// streak.
func (r *sender) answered(resp response, gen uint64) {
	r.throttle.observe(resp, gen)
	switch resp.verdict() {
	case verdictAck:
		r.health.Succeeded(r.sub.Name)
	case verdictGone:
		r.health.Disable(context.Background(), r.disabledRecord(health.ReasonGone, resp))
	case verdictRetry:
		if r.health.Failed(r.sub.Name) {
			r.health.Disable(context.Background(), r.disabledRecord(health.ReasonFailing, resp))
		}
	}
}

// disabledRecord is the record of disabling the subscription for reason
// after resp.
func (r *sender) disabledRecord(reason string, resp response) health.DisabledRecord {
	return health.DisabledRecord{Subscription: r.sub.Name, Endpoint: r.endpoint, Reason: reason, Status: resp.status, LastError: resp.reason()}
}

// gate waits until the subscription may POST: while it is disabled, and
// for its throttle (rate, Retry-After). hold, called only when it must
// wait, keeps the message in hand from redelivery until the returned
// stop. It returns the throttle's generation for send, or ctx's error
// if ctx ends first.
func (r *sender) gate(ctx context.Context, hold func() (stop func())) (uint64, error) {
	if r.health.IsDisabled(r.sub.Name) || r.throttle.holding() {
		defer hold()()
		if err := r.health.WaitEnabled(ctx, r.sub.Name); err != nil {
			return 0, err
		}
	}
	return r.throttle.wait(ctx)
}

// count counts one attempt's outcome in
// jsbridge_consumer_deliveries_total; status is the HTTP status of an ack.
func (r *sender) count(outcome, class string, status int) {
	if outcome == OutcomeAck && status/100 == 2 {
		r.acked2xx().Inc()
		return
	}
	r.metrics.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
}

// retryDelay is retryDelay with the subscription's backoff.
func (r *sender) retryDelay(attempt int, retryAfter time.Duration) time.Duration {
	return retryDelay(r.sub.BackOff, attempt, retryAfter)
}

// requestHeader returns a new request header holding the subscription's
// static headers (Subscription.Headers, User-Agent), with room for the
// per-delivery ones. The static values are shared between requests: the
// transport only reads them, and every header set per delivery (see
// reservedHeaders) replaces a value rather than appending to it.
func (r *sender) requestHeader() http.Header {
	h := make(http.Header, len(r.static)+8)
	for k, v := range r.static {
		h[k] = v
	}
	return h
}

// post sends one signed POST and reads the response. While it runs longer
// than AckWait/2 it calls inProgress (the message's InProgress) every
// AckWait/2 so JetStream does not redeliver; inProgress may be nil. hdr
// comes from requestHeader and buildBody. order, when not nil, is an
// ordered webhook's place in its stream's version chain: its headers
// (Jsbridge-Previous-Version, and Jsbridge-Partition and
// Jsbridge-Lease-Epoch from a partition's owner) and the order signature
// are set with the same timestamp as the signature.
func (r *sender) post(ctx context.Context, inProgress func() error, id string, body []byte, hdr http.Header, order *webhook.OrderFields) response {
	ctx, cancel := context.WithTimeout(ctx, r.sub.Timeout)
	defer cancel()
	if inProgress != nil {
		defer r.keepAlive(id, inProgress)()
	}

	hdr[wire.HeaderIdempotencyKey] = []string{wire.IdempotencyKey(id)}
	// net/http takes a request with Idempotency-Key for idempotent and
	// re-sends it by itself on a broken connection, rewinding the body
	// with GetBody: a re-send past the lease check (a replica waking from
	// a freeze). newRequest sets no GetBody: only a request whose body was
	// never read is re-sent; anything else comes back here as an error and
	// is retried through the lease check.
	req := r.ep.newRequest(ctx, hdr, body)
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(hdr)) // traceparent: the attempt's span
	signer, now := r.signer.Load(), time.Now()
	signer.Sign(hdr, id, now, body)
	if order != nil {
		signer.SignOrder(hdr, id, now, *order)
	}

	start := time.Now()
	resp, err := r.ep.do(r.client, req)
	if err != nil {
		r.duration.Observe(time.Since(start).Seconds())
		var ne net.Error
		timeout := !errors.Is(err, egress.ErrForbiddenAddress) && (errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()))
		return response{err: err, timeout: timeout, retryAfter: -1, at: start}
	}
	// Drain (a little of) the body so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	r.duration.Observe(time.Since(start).Seconds())
	out := response{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), at: start}
	if resp.StatusCode == http.StatusConflict {
		out.order = resp.Header.Get(wire.HeaderOrder)
		out.orderEpoch, _ = strconv.ParseUint(resp.Header.Get(wire.HeaderOrderEpoch), 10, 64) // absent or bad: 0, the epoch is doubled
		out.orderLast = resp.Header.Get(wire.HeaderOrderLast)
	}
	return out
}

// keepAlive calls inProgress every AckWait/2 until the returned stop is
// called. It costs one timer that never fires on a POST shorter than
// AckWait/2 (no goroutine waits for it).
func (r *sender) keepAlive(id string, inProgress func() error) (stop func()) {
	every := r.sub.AckWait / 2
	var mu sync.Mutex
	stopped := false
	var t clockwork.Timer
	mu.Lock()
	t = r.clock.AfterFunc(every, func() {
		if err := inProgress(); errors.Is(err, errLeasePassed) || errors.Is(err, errNotConnected) {
			r.log.Debug("in progress not sent", slog.String("event_id", id), slog.Any("reason", err))
		} else if err != nil {
			r.log.Warn("in progress failed", slog.String("event_id", id), slog.Any("error", err))
		}
		mu.Lock()
		if !stopped {
			t.Reset(every)
		}
		mu.Unlock()
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// startAttempt starts the attempt's span as a child of the message's trace
// context and returns the context carrying both.
func (r *sender) startAttempt(ctx context.Context, msg jetstream.Msg, id string, attempt int) (context.Context, *attemptState) {
	st := &attemptState{attempt: attempt, id: id, msg: msg, began: time.Now()}
	if h := msg.Headers(); len(h) > 0 {
		ctx = tracing.Propagator.Extract(ctx, tracing.HeaderCarrier(h))
	}
	ctx, st.span = r.tracer.Start(ctx, r.spanName, clientKind)
	return context.WithValue(ctx, attemptKey{}, st), st
}

// endAttempt ends the span and hands the attempt to the attempts record.
func (r *sender) endAttempt(st *attemptState) {
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
