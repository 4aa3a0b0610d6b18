package attempt

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/wire"
)

// MaxRetryAfter caps the delay an endpoint can ask for with Retry-After.
const MaxRetryAfter = 5 * time.Minute

// Verdict is what one attempt's result means for the message, by the
// webhook contract.
type Verdict int

const (
	// VerdictAck: 2xx; the message is acked.
	VerdictAck Verdict = iota
	// VerdictRetry: 3xx (not followed), 408, 5xx, a timeout or a network
	// or TLS error: retried with backoff, an endpoint failure.
	VerdictRetry
	// VerdictPermanent: any other 4xx, or an address the dial guard
	// refuses: dead-lettered at once.
	VerdictPermanent
	// VerdictOrderWait: the receiver's order gate refused the event for
	// now (409 with Jsbridge-Order gap or in-progress): retried, never
	// dead-lettered, spends no attempt, no endpoint failure.
	VerdictOrderWait
	// VerdictStaleEpoch: the receiver's order gate refused the event
	// because it processed the stream under a later lease epoch (409 with
	// Jsbridge-Order stale-epoch): the sender's lease is stale.
	VerdictStaleEpoch
	// VerdictThrottle: the endpoint asks to slow down (429, or 503 with a
	// Retry-After): the rate is cut (internal/deliver/throttle) and the event retried in
	// place, spending no attempt and counting as no breaker failure. A 503
	// without Retry-After is VerdictRetry: what a dead endpoint behind a
	// proxy answers for ever, so it counts as a failure.
	VerdictThrottle
	// VerdictGone: 410 Gone: the endpoint says it no longer exists; the
	// subscription is disabled at once (package health) and the event goes back
	// unsent, neither dead-lettered nor counted as an attempt.
	VerdictGone
)

// Response is the result of one POST.
type Response struct {
	// Status is the HTTP status; 0 when the request failed (Err).
	Status int
	// RetryAfter is the delay the answer's Retry-After asks for (see
	// ParseRetryAfter); -1 when the endpoint sent none.
	RetryAfter time.Duration
	// Err is the transport error; Status is 0.
	Err error
	// Timeout is whether Err is a timeout (Subscription.Timeout).
	Timeout bool
	// At is when the request was sent.
	At time.Time
	// Order is the answer's Jsbridge-Order (wire.HeaderOrder) when the
	// status is 409, else ""; OrderLast its Jsbridge-Order-Last (the
	// receiver's last version of the stream, on a gap).
	Order     string
	OrderLast string
	// OrderEpoch is the answer's Jsbridge-Order-Epoch
	// (wire.HeaderOrderEpoch) with a stale-epoch answer: the highest
	// epoch the receiver processed for the stream; 0 when absent.
	OrderEpoch uint64
}

// Verdict classifies a Response by the webhook contract (docs/architecture.md): 2xx
// acks; 3xx (not followed), 408, 5xx, timeouts and network errors are
// retried; 429, and 503 with Retry-After, throttle; 410 disables the
// subscription; a 409 of an order gate (Jsbridge-Order gap or in-progress) waits,
// stale-epoch says the lease is stale; any other 4xx is permanent.
func (r Response) Verdict() Verdict {
	switch {
	case errors.Is(r.Err, egress.ErrForbiddenAddress):
		return VerdictPermanent
	case r.Err != nil:
		// TLS failures too (a refused or missing client certificate, an
		// endpoint certificate the CA bundle does not verify): usually a
		// certificate being rotated on one side, fixed without touching
		// the event; MaxDeliver still dead-letters it in the end.
		return VerdictRetry
	case r.Status >= 200 && r.Status < 300:
		return VerdictAck
	case r.Status == http.StatusTooManyRequests,
		r.Status == http.StatusServiceUnavailable && r.RetryAfter >= 0:
		return VerdictThrottle
	case r.Status == http.StatusGone:
		return VerdictGone
	case r.Status == http.StatusRequestTimeout:
		return VerdictRetry
	case r.Status == http.StatusConflict && r.Order == wire.OrderStaleEpoch:
		return VerdictStaleEpoch
	case r.Status == http.StatusConflict && wire.OrderRetryInPlace(r.Order):
		return VerdictOrderWait
	case r.Status >= 400 && r.Status < 500:
		return VerdictPermanent
	default:
		return VerdictRetry
	}
}

// Class is the status_class label of jsbridge_consumer_deliveries_total.
func (r Response) Class() string {
	switch {
	case r.Timeout:
		return ClassTimeout
	case errors.Is(r.Err, egress.ErrForbiddenAddress):
		return ClassForbidden
	case r.Err != nil && egress.IsTLSError(r.Err):
		return ClassTLS
	case r.Err != nil:
		return ClassNetwork
	case r.Status >= 100 && r.Status < 600:
		return strconv.Itoa(r.Status/100) + "xx"
	default:
		return ClassNetwork
	}
}

// reason describes the Response for logs and dead letters.
func (r Response) Reason() string {
	switch {
	case r.Timeout:
		return "timeout: " + r.Err.Error()
	case r.Err != nil:
		return r.Err.Error()
	case r.Order != "" && r.OrderLast != "":
		return fmt.Sprintf("HTTP %d %s (order gate: %s; its last version of the stream: %s)", r.Status, http.StatusText(r.Status), r.Order, r.OrderLast)
	case r.Order != "":
		return fmt.Sprintf("HTTP %d %s (order gate: %s)", r.Status, http.StatusText(r.Status), r.Order)
	default:
		return fmt.Sprintf("HTTP %d %s", r.Status, http.StatusText(r.Status))
	}
}

// errEndpoint marks a Response that counts as an endpoint failure for the
// circuit breaker.
var errEndpoint = errors.New("endpoint failure")

// breakerErr is what the breaker counts: retryable responses are endpoint
// failures; a throttling answer is not counted at all (breaker.ErrExcluded);
// a 2xx, a permanent 4xx or an order gate's 409 shows the endpoint is up.
func (r Response) breakerErr() error {
	switch r.Verdict() {
	case VerdictRetry:
		return fmt.Errorf("%w: %s", errEndpoint, r.Reason())
	case VerdictThrottle:
		return fmt.Errorf("%w: %s", breaker.ErrExcluded, r.Reason())
	}
	return nil
}

// StaticHeaders returns the canonical form of headers plus User-Agent
// and, unless headers name one, Accept-Encoding: gzip. net/http's
// transport adds that header to every request by itself otherwise,
// through a header map of its own made for each request (three
// allocations a webhook); set here it is the same on the wire, and the
// transport leaves a gzip answer's body as it came, which an attempt
// drains without reading.
func StaticHeaders(headers map[string]string, userAgent string) http.Header {
	h := make(http.Header, len(headers)+2)
	for k, v := range headers {
		h.Set(k, v)
	}
	h.Set("User-Agent", userAgent)
	if h.Get("Accept-Encoding") == "" {
		h.Set("Accept-Encoding", "gzip")
	}
	return h
}

// ParseRetryAfter returns the delay a Retry-After value asks for (delay
// seconds or an HTTP-date; RFC 9110 section 10.2.3), or -1 when v is empty
// or invalid. A date in the past is 0.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return -1
		}
		if n > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return -1
}
