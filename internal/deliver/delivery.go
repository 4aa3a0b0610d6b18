package deliver

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// MaxRetryAfter caps the delay an endpoint can ask for with Retry-After.
const MaxRetryAfter = 5 * time.Minute

// verdict is what one attempt's result means for the message.
type verdict int

const (
	verdictAck verdict = iota
	verdictRetry
	verdictPermanent
	// verdictOrderWait: the receiver's order gate refused the event for
	// now (409 with Jsbridge-Order gap or in-progress): retried, never
	// dead-lettered, spends no attempt, no endpoint failure.
	verdictOrderWait
	// verdictStaleEpoch: the receiver's order gate refused the event
	// because it processed the stream under a later lease epoch (409 with
	// Jsbridge-Order stale-epoch): the sender's lease is stale.
	verdictStaleEpoch
	// verdictThrottle: the endpoint asks to slow down (429, or 503 with a
	// Retry-After): the rate is cut (throttle.go) and the event retried in
	// place, spending no attempt and counting as no breaker failure. A 503
	// without Retry-After is verdictRetry: what a dead endpoint behind a
	// proxy answers for ever, so it counts as a failure.
	verdictThrottle
	// verdictGone: 410 Gone: the endpoint says it no longer exists; the
	// subscription is disabled at once (package health) and the event goes back
	// unsent, neither dead-lettered nor counted as an attempt.
	verdictGone
)

// response is the result of one POST.
type response struct {
	status     int
	retryAfter time.Duration // -1 when the endpoint sent none
	err        error         // transport error; status is 0
	timeout    bool
	at         time.Time // when the request was sent
	// order is the answer's Jsbridge-Order (wire.HeaderOrder) when the
	// status is 409, else ""; orderLast its Jsbridge-Order-Last (the
	// receiver's last version of the stream, on a gap).
	order     string
	orderLast string
	// orderEpoch is the answer's Jsbridge-Order-Epoch
	// (wire.HeaderOrderEpoch) with a stale-epoch answer: the highest
	// epoch the receiver processed for the stream; 0 when absent.
	orderEpoch uint64
}

// verdict classifies a response by the webhook contract (docs/architecture.md): 2xx
// acks; 3xx (not followed), 408, 5xx, timeouts and network errors are
// retried; 429, and 503 with Retry-After, throttle; 410 disables the
// subscription; a 409 of an order gate (Jsbridge-Order gap or in-progress) waits,
// stale-epoch says the lease is stale; any other 4xx is permanent.
func (r response) verdict() verdict {
	switch {
	case errors.Is(r.err, egress.ErrForbiddenAddress):
		return verdictPermanent
	case r.err != nil:
		// TLS failures too (a refused or missing client certificate, an
		// endpoint certificate the CA bundle does not verify): usually a
		// certificate being rotated on one side, fixed without touching
		// the event; MaxDeliver still dead-letters it in the end.
		return verdictRetry
	case r.status >= 200 && r.status < 300:
		return verdictAck
	case r.status == http.StatusTooManyRequests,
		r.status == http.StatusServiceUnavailable && r.retryAfter >= 0:
		return verdictThrottle
	case r.status == http.StatusGone:
		return verdictGone
	case r.status == http.StatusRequestTimeout:
		return verdictRetry
	case r.status == http.StatusConflict && r.order == wire.OrderStaleEpoch:
		return verdictStaleEpoch
	case r.status == http.StatusConflict && wire.OrderRetryInPlace(r.order):
		return verdictOrderWait
	case r.status >= 400 && r.status < 500:
		return verdictPermanent
	default:
		return verdictRetry
	}
}

// class is the status_class label.
func (r response) class() string {
	switch {
	case r.timeout:
		return ClassTimeout
	case errors.Is(r.err, egress.ErrForbiddenAddress):
		return ClassForbidden
	case r.err != nil && egress.IsTLSError(r.err):
		return ClassTLS
	case r.err != nil:
		return ClassNetwork
	case r.status >= 100 && r.status < 600:
		return strconv.Itoa(r.status/100) + "xx"
	default:
		return ClassNetwork
	}
}

// reason describes the response for logs and dead letters.
func (r response) reason() string {
	switch {
	case r.timeout:
		return "timeout: " + r.err.Error()
	case r.err != nil:
		return r.err.Error()
	case r.order != "" && r.orderLast != "":
		return fmt.Sprintf("HTTP %d %s (order gate: %s; its last version of the stream: %s)", r.status, http.StatusText(r.status), r.order, r.orderLast)
	case r.order != "":
		return fmt.Sprintf("HTTP %d %s (order gate: %s)", r.status, http.StatusText(r.status), r.order)
	default:
		return fmt.Sprintf("HTTP %d %s", r.status, http.StatusText(r.status))
	}
}

// errEndpoint marks a response that counts as an endpoint failure for the
// circuit breaker.
var errEndpoint = errors.New("endpoint failure")

// breakerErr is what the breaker counts: retryable responses are endpoint
// failures; a throttling answer is not counted at all (breaker.ErrExcluded);
// a 2xx, a permanent 4xx or an order gate's 409 shows the endpoint is up.
func (r response) breakerErr() error {
	switch r.verdict() {
	case verdictRetry:
		return fmt.Errorf("%w: %s", errEndpoint, r.reason())
	case verdictThrottle:
		return fmt.Errorf("%w: %s", breaker.ErrExcluded, r.reason())
	}
	return nil
}

// errMalformed marks a message deliver cannot turn into a webhook.
var errMalformed = errors.New("malformed message")

// header returns the first value of key in h, matching the exact key first
// and then case-insensitively (publishers may canonicalize names).
func header(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// eventID is the event id of a message: Nats-Msg-Id, else ce-id.
func eventID(msg jetstream.Msg) string {
	if id := header(msg.Headers(), wire.HeaderMsgID); id != "" {
		return id
	}
	return header(msg.Headers(), wire.HeaderID)
}

// buildBody returns the request body for msg and sets its headers
// (Content-Type and, in binary mode, the ce-* attributes) on h.
func buildBody(mode subscription.BodyMode, id string, mh nats.Header, data []byte, h http.Header) ([]byte, error) {
	contentType := header(mh, wire.HeaderContentType)
	if contentType == "" {
		contentType = event.ContentTypeJSON
	}
	if mode == subscription.BodyBinary {
		for k, vs := range mh {
			if len(vs) > 0 && wire.IsCEHeader(k) {
				h.Set(k, vs[0])
			}
		}
		h.Set(wire.HeaderID, id)
		if h.Get(wire.HeaderSpecVersion) == "" {
			h.Set(wire.HeaderSpecVersion, event.SpecVersion)
		}
		h.Set(wire.HeaderContentType, contentType)
		return data, nil
	}

	// Header values are percent-encoded (forward uses
	// wire.EncodeHeaderValue); the JSON envelope carries them decoded.
	var decodeErr error
	attr := func(name string) string {
		v, err := wire.DecodeHeaderValue(header(mh, name))
		if err != nil && decodeErr == nil {
			decodeErr = fmt.Errorf("%w: %s: %w", errMalformed, name, err)
		}
		return v
	}
	ce := event.CloudEvent{
		SpecVersion:     header(mh, wire.HeaderSpecVersion),
		ID:              id,
		Source:          attr(wire.HeaderSource),
		Type:            attr(wire.HeaderType),
		Subject:         attr(wire.HeaderSubject),
		Time:            header(mh, wire.HeaderTime),
		DataContentType: contentType,
		CorrelationID:   attr(wire.HeaderCorrelationID),
		CausationID:     attr(wire.HeaderCausationID),
	}
	if decodeErr != nil {
		return nil, decodeErr
	}
	if ce.SpecVersion == "" {
		ce.SpecVersion = event.SpecVersion
	}
	if v := header(mh, wire.HeaderStreamVersion); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q is not an integer", errMalformed, wire.HeaderStreamVersion, v)
		}
		ce.StreamVersion = n
	}
	if len(data) > 0 && !json.Valid(data) {
		return nil, fmt.Errorf("%w: data is not JSON, cannot embed it in a structured-mode body", errMalformed)
	}
	ce.Data = data
	env := ce.AppendJSON(make([]byte, 0, 256+len(data)))
	h[wire.HeaderContentType] = contentTypeCloudEvents
	return env, nil
}

// contentTypeCloudEvents is the Content-Type value of a structured-mode
// body, shared by every request (the transport only reads it).
var contentTypeCloudEvents = []string{event.ContentTypeCloudEventsJSON}

// nak returns msg to JetStream for redelivery after delay, logging a
// failure to log.
func nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration) {
	if err := msg.NakWithDelay(delay); err != nil {
		log.Warn("nak failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}

// staticHeaders returns the canonical form of headers plus User-Agent.
func staticHeaders(headers map[string]string, userAgent string) http.Header {
	h := make(http.Header, len(headers)+1)
	for k, v := range headers {
		h.Set(k, v)
	}
	h.Set("User-Agent", userAgent)
	return h
}

// parseRetryAfter returns the delay a Retry-After value asks for (delay
// seconds or an HTTP-date; RFC 9110 section 10.2.3), or -1 when v is empty
// or invalid. A date in the past is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
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
