package attempt

import (
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
)

// Outcome label values of jsbridge_consumer_deliveries_total.
const (
	// OutcomeAck: the endpoint answered 2xx; the message was acked.
	OutcomeAck = "ack"
	// OutcomeRetry: a retryable failure; the message was Nak'd with a delay.
	OutcomeRetry = "retry"
	// OutcomeTerm: a permanent failure (a 4xx other than 408 and 429, or a
	// malformed message); dead-lettered and Term'd.
	OutcomeTerm = "term"
	// OutcomeExhausted: a retryable failure on the last attempt
	// (MaxDeliver); dead-lettered and Term'd.
	OutcomeExhausted = "exhausted"
	// OutcomeBreakerOpen: the endpoint's circuit breaker rejected the
	// attempt; nothing was sent and the message was Nak'd with the open
	// timeout.
	OutcomeBreakerOpen = "breaker_open"
	// OutcomeStaleEpoch: the receiver's order gate answered 409
	// Jsbridge-Order: stale-epoch (it processed the stream under a later
	// partition lease): the ordered partition was released, the message
	// neither acked nor dead-lettered. A gate's gap or in-progress answer
	// counts as OutcomeRetry.
	OutcomeStaleEpoch = "stale_epoch"
	// OutcomeOrderStuck: the receiver's order gate refused the event (gap,
	// in-progress) for longer than Config.OrderStuckAfter: it was
	// dead-lettered and its stream parked (orderstuck.go).
	OutcomeOrderStuck = "order_stuck"
	// OutcomeThrottled: the endpoint answered 429, or 503 with
	// Retry-After: the subscription's rate was cut and the event is sent
	// again in place; no attempt spent.
	OutcomeThrottled = "throttled"
	// OutcomeDisabled: the endpoint answered 410 Gone: the subscription
	// was disabled; the event waits, unsent, until it is enabled.
	OutcomeDisabled = "disabled"
)

// Status class label values of jsbridge_consumer_deliveries_total besides
// "2xx" … "5xx".
const (
	// ClassTimeout: the request timed out (Subscription.Timeout).
	ClassTimeout = "timeout"
	// ClassNetwork: the request failed without a response (other than a
	// timeout or a TLS failure).
	ClassNetwork = "network"
	// ClassTLS: the TLS handshake or a certificate check failed: the
	// endpoint refused the client certificate (or wanted one), or its
	// certificate did not verify. Retried like a network error.
	ClassTLS = "tls"
	// ClassNone: no request was sent (breaker open, malformed message).
	ClassNone = "none"
	// ClassForbidden: the endpoint resolved to an address the subscription
	// may not reach (ErrForbiddenAddress); no request was sent.
	ClassForbidden = "forbidden"
)

// ErrLeasePassed is the cause a PostFence gives when its partition's lease
// deadline passed: before the POST (Send's notSent) or during it (the
// POST's context is cut, Response.Err wraps it). A POST cut by it counts
// for neither the breaker nor the subscription's health. It is the lease
// fence's own (owner.ErrLeasePassed), so that an owner.Fence's Bound is a
// PostFence as it is.
var ErrLeasePassed = owner.ErrLeasePassed
