// Package attempt makes one attempt of a webhook delivery: it builds the
// request (body, headers), signs it, POSTs it through the endpoint's
// circuit breaker under the attempt's span and record, reads the answer
// (verdict, Retry-After) and returns a Settlement: what the answer means
// for the message. The settler, Claim (claim.go: the shared engine's
// attempts of one claimed partition, the fan-out's fanout.Sender), acts
// on that one value: it settles the event, retries it in place or
// dead-letters it (and parks its stream if ordered). Sender.Attempt
// knows nothing of partitions: what an ordered attempt adds (the version
// chain's fields, the lease fence) are parameters of the call (Call).
//
// The subscription's AIMD throttle (internal/deliver/throttle) and its
// health (Health) are fed by every answer.
package attempt

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/payload"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Call is what one attempt takes beyond its message and number: the
// settler's specifics, as parameters.
type Call struct {
	// Replica, when not "", is sent as Jsbridge-Replica.
	Replica string
	// Chain, when not nil, is an ordered subscription's: the message's
	// place in its stream's version chain (OrderFieldsOf) is signed with
	// the request, or, for a message without a stream version, the
	// owner's Jsbridge-Partition and Jsbridge-Lease-Epoch go unsigned.
	Chain *Chain
	// Ready, when not nil, is asked once the request is built, before the
	// attempt starts: gen is the throttle's generation (Gate), done is
	// called once the POST ended (nil: nothing), and !ok means the
	// attempt may not start now (ActNotReady: nothing started, nothing
	// counted). Nil: the attempt starts at once, at generation 0.
	Ready func() (gen uint64, done func(), ok bool)
	// Fence, when not nil, is the lease fence the POST passes once the
	// breaker let it through (see PostFence): refused, the attempt is
	// ActNotSent; cut during the POST, ActCut.
	Fence PostFence
	// AfterFailure says an earlier attempt of this delivery failed
	// without spending an attempt number (throttled, disabled, refused
	// by an order gate, cut at the lease deadline, breaker open, all
	// retried in place): a success now ends a series with a failure in
	// it and is recorded even under attemptlog.ModeFailures, so the
	// trace shows how the series ended.
	AfterFailure bool
}

// Chain is an ordered webhook's sender side of the version chain: the
// version its subscription delivered of the stream before this one
// (Previous; -1: none), and the partition's owner, its partition and
// lease epoch.
type Chain struct {
	Previous  int64
	Partition int
	Epoch     uint64
}

// Attempt makes attempt n (1-based) of msg, the event as the events
// stream holds it (its sequence there is the attempts record's
// StreamSeq; its headers carry the event id, the CloudEvents
// attributes, the stream version and the trace context): it reads the event id (and,
// with c.Chain, the place in the version chain) from msg's headers,
// builds the webhook, waits for c.Ready, starts the attempt's span,
// POSTs it through the breaker (and c.Fence), feeds the answer to the
// throttle and the health, and returns what the answer means for msg,
// with the event id and the order fields the settler's dead letter
// names. The settlement's Trace is the attempt's span and record,
// decided with the settlement's outcome: the settler ends it with End,
// after deciding it again if it settles otherwise (an order gate's
// refusals turned order-stuck, a dead letter that could not be
// written). Attempt counts the outcomes no settler changes
// (ActBreakerOpen, ActCut); the settler counts the rest once it acted
// (Count).
func (r *Sender) Attempt(ctx context.Context, msg reader.Event, n int, c Call) Settlement {
	id := payload.EventID(msg.Header)
	var order *webhook.OrderFields
	if c.Chain != nil {
		order = OrderFieldsOf(msg.Header, c.Chain.Previous, c.Chain.Partition, c.Chain.Epoch)
	}
	body, hdr, err := r.request(msg, id, c.Replica, c.Chain != nil)
	if err != nil {
		_, tr := r.start(ctx, msg, id, n)
		tr.afterFailure = c.AfterFailure
		s := Settlement{Act: ActDeadLetter, Outcome: OutcomeTerm, Class: ClassNone, Reason: err.Error(), EventID: id, Order: order, Trace: tr}
		tr.Decide(s.Outcome, s.Class, s.Reason)
		return s
	}
	if order == nil && c.Chain != nil {
		hdr.Set(wire.HeaderPartition, strconv.Itoa(c.Chain.Partition))
		hdr.Set(wire.HeaderLeaseEpoch, strconv.FormatUint(c.Chain.Epoch, 10))
	}
	var gen uint64
	if c.Ready != nil {
		g, done, ok := c.Ready()
		if !ok {
			return Settlement{Act: ActNotReady, EventID: id, Order: order}
		}
		if done != nil {
			defer done()
		}
		gen = g
	}
	actx, tr := r.start(ctx, msg, id, n)
	tr.afterFailure = c.AfterFailure
	resp, notSent := r.send(actx, tr, c.Fence, gen, id, body, hdr, order)
	var s Settlement
	switch {
	case errors.Is(notSent, ErrLeasePassed):
		tr.EndNotSent(notSent)
		return Settlement{Act: ActNotSent, Reason: notSent.Error(), EventID: id, Order: order}
	case notSent != nil:
		s = Settlement{Act: ActBreakerOpen, Outcome: OutcomeBreakerOpen, Class: ClassNone, Reason: "circuit breaker open: not sent", Delay: r.br.OpenTimeout()}
		r.Count(s.Outcome, s.Class, 0)
	case errors.Is(resp.Err, ErrLeasePassed):
		s = Settlement{Act: ActCut, Outcome: OutcomeRetry, Class: ClassTimeout, Reason: resp.Reason()}
		r.Count(s.Outcome, s.Class, 0)
	default:
		s = SettlementOf(resp, n, r.sub.MaxDeliver, r.sub.BackOff)
	}
	s.Response, s.EventID, s.Order, s.Trace = resp, id, order, tr
	tr.Decide(s.Outcome, s.Class, s.Reason)
	return s
}

// Act is what a settler does with the message after an attempt.
type Act int

const (
	ActAck        Act = iota // 2xx: ack
	ActRetry                 // retryable and attempts left: try again after delay
	ActDeadLetter            // permanent, or retryable on the last attempt: dead-letter
	// ActWait: the receiver's order gate refused the event for now (gap,
	// in-progress): try again after delay; no attempt spent, never
	// dead-lettered.
	ActWait
	// ActStale: the receiver's order gate processed the stream under a
	// later lease epoch: this replica's lease is stale. An ordered
	// partition stops (released; nothing acked, nothing dead-lettered);
	// an unordered settler, whose webhooks carry no epoch, waits.
	ActStale
	// ActThrottle: the endpoint asked to slow down (VerdictThrottle): the
	// throttle was cut; try again in place after delay (Retry-After, the
	// throttle waits for it too); no attempt spent, never dead-lettered.
	ActThrottle
	// ActDisable: 410 Gone: the subscription is disabled (package health); the
	// event waits in place until it is enabled; no attempt spent, nothing
	// dead-lettered.
	ActDisable
	// ActBreakerOpen: the breaker let nothing through (open, or another
	// attempt's half-open probe running): nothing sent; Delay is the
	// breaker's open timeout. Counted by Attempt.
	ActBreakerOpen
	// ActCut: Call.Fence cut the POST at the lease deadline: nothing is
	// settled from it and no attempt spent; it counts for neither the
	// breaker nor the health. Counted by Attempt (retry, timeout).
	ActCut
	// ActNotSent: Call.Fence refused the POST (the lease deadline passed
	// while the breaker let it through): nothing sent, nothing counted;
	// the span ended with the reason, no record. Trace is nil.
	ActNotSent
	// ActNotReady: Call.Ready said the attempt may not start: nothing
	// started. Trace is nil.
	ActNotReady
)

// OrderWaitDelay is the delay before an event refused by a receiver's
// order gate (409 gap or in-progress) is sent again when the answer has no
// Retry-After; a Retry-After is honoured up to MaxOrderWait.
const (
	OrderWaitDelay = 200 * time.Millisecond
	MaxOrderWait   = 5 * time.Second
)

// Settlement is what one attempt's Response means for its message, by the
// webhook contract (Response.Verdict) with MaxDeliver and the backoff
// applied: the act, the outcome and status_class labels, the reason ("" when
// acked) and, for ActRetry, the delay before the next attempt.
type Settlement struct {
	// Act is what the settler does with the message.
	Act Act
	// Outcome and Class are the outcome and status_class labels of
	// jsbridge_consumer_deliveries_total.
	Outcome string
	Class   string
	// Reason says why, for logs and dead letters ("" when acked).
	Reason string
	// Delay is the wait before the next attempt (ActRetry, ActWait,
	// ActStale, ActThrottle), or the breaker's open timeout
	// (ActBreakerOpen).
	Delay time.Duration
	// Response is the answer (the zero Response when nothing was sent or
	// the message could not become a webhook).
	Response Response
	// EventID is the message's event id (payload.EventID; "" when it has none).
	EventID string
	// Order is the message's place in its stream's version chain, as the
	// webhook named it (nil: none; see Call.Chain).
	Order *webhook.OrderFields
	// Trace is the attempt's span and record, decided with Outcome,
	// Class and Reason; the settler ends it with End (nil for
	// ActNotSent and ActNotReady).
	Trace *Trace
}

// SettlementOf decides what resp, the answer to attempt (1-based) of a
// subscription with maxDeliver attempts (-1 or 0: no limit) and backOff,
// means for its message. A pure function of its arguments.
func SettlementOf(resp Response, attempt, maxDeliver int, backOff []time.Duration) Settlement {
	class := resp.Class()
	switch resp.Verdict() {
	case VerdictAck:
		return Settlement{Act: ActAck, Outcome: OutcomeAck, Class: class}
	case VerdictPermanent:
		return Settlement{Act: ActDeadLetter, Outcome: OutcomeTerm, Class: class, Reason: resp.Reason()}
	case VerdictOrderWait:
		return Settlement{Act: ActWait, Outcome: OutcomeRetry, Class: class, Reason: resp.Reason(), Delay: orderWait(resp.RetryAfter)}
	case VerdictStaleEpoch:
		return Settlement{Act: ActStale, Outcome: OutcomeStaleEpoch, Class: class, Reason: resp.Reason(), Delay: orderWait(resp.RetryAfter)}
	case VerdictThrottle:
		return Settlement{Act: ActThrottle, Outcome: OutcomeThrottled, Class: class, Reason: resp.Reason(), Delay: max(resp.RetryAfter, 0)}
	case VerdictGone:
		return Settlement{Act: ActDisable, Outcome: OutcomeDisabled, Class: class, Reason: resp.Reason()}
	}
	if maxDeliver > 0 && attempt >= maxDeliver {
		return Settlement{Act: ActDeadLetter, Outcome: OutcomeExhausted, Class: class,
			Reason: fmt.Sprintf("%s (attempt %d of MaxDeliver %d)", resp.Reason(), attempt, maxDeliver)}
	}
	return Settlement{Act: ActRetry, Outcome: OutcomeRetry, Class: class, Reason: resp.Reason(), Delay: retryDelay(backOff, attempt, resp.RetryAfter)}
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
