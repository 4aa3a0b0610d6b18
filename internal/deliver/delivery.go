package deliver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/tracing"
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
)

// response is the result of one POST.
type response struct {
	status     int
	retryAfter time.Duration // -1 when the endpoint sent none
	err        error         // transport error; status is 0
	timeout    bool
	at         time.Time // when the request was sent
}

// verdict classifies a response by the webhook contract (docs/architecture.md): 2xx
// acks; 3xx (not followed), 408, 429, 5xx, timeouts and network errors are
// retried; any other 4xx is permanent.
func (r response) verdict() verdict {
	switch {
	case errors.Is(r.err, ErrForbiddenAddress):
		return verdictPermanent
	case r.err != nil:
		// TLS failures too (a refused or missing client certificate, an
		// endpoint certificate the CA bundle does not verify): usually a
		// certificate being rotated on one side, fixed without touching
		// the event; MaxDeliver still dead-letters it in the end.
		return verdictRetry
	case r.status >= 200 && r.status < 300:
		return verdictAck
	case r.status == http.StatusRequestTimeout, r.status == http.StatusTooManyRequests:
		return verdictRetry
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
	case errors.Is(r.err, ErrForbiddenAddress):
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
	default:
		return fmt.Sprintf("HTTP %d %s", r.status, http.StatusText(r.status))
	}
}

// errEndpoint marks a response that counts as an endpoint failure for the
// circuit breaker.
var errEndpoint = errors.New("endpoint failure")

// breakerErr is what the breaker counts: retryable responses are endpoint
// failures; a 2xx or a permanent 4xx shows the endpoint is up.
func (r response) breakerErr() error {
	if r.verdict() == verdictRetry {
		return fmt.Errorf("%w: %s", errEndpoint, r.reason())
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
func buildBody(mode BodyMode, id string, mh nats.Header, data []byte, h http.Header) ([]byte, error) {
	contentType := header(mh, wire.HeaderContentType)
	if contentType == "" {
		contentType = event.ContentTypeJSON
	}
	if mode == BodyBinary {
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

// handle delivers one message and acks, Naks or Terms it: the unordered
// settler of one attempt (see attempt.go). ctx carries no cancellation
// from Run: a delivery that started finishes (bounded by
// Subscription.Timeout), so shutdown loses nothing.
func (r *runner) handle(ctx context.Context, msg jetstream.Msg) {
	r.inFlight.Inc()
	defer r.inFlight.Dec()

	attempt := attemptNumber(msg)
	id := eventID(msg)
	ctx, at := r.startAttempt(ctx, msg, id, attempt)
	defer r.endAttempt(at)
	// The logger with this delivery's attributes is built only when
	// something is logged: slog's With formats them at once, and the common
	// path (a 2xx at info level) logs nothing.
	log := func(more ...any) *slog.Logger {
		return r.log.With(append([]any{slog.String("event_id", id), slog.Int("attempt", attempt)}, more...)...)
	}
	if attempt > 1 {
		r.redeliveries.Inc()
	}

	body, hdr, err := r.request(msg, id, "")
	if err != nil {
		r.giveUp(ctx, log(), msg, deadletter.Letter{EventID: id, Attempt: attempt, Reason: err.Error()}, OutcomeTerm, ClassNone)
		return
	}
	resp, refused := r.send(ctx, at, msg.InProgress, id, body, hdr)
	if refused {
		at.decide(OutcomeBreakerOpen, ClassNone, "circuit breaker open: not sent")
		delay := r.br.OpenTimeout()
		r.count(OutcomeBreakerOpen, ClassNone, 0)
		l := log()
		l.Debug("circuit breaker open, not sent", slog.Duration("delay", delay))
		nak(l, msg, delay)
		return
	}

	s := settlementOf(resp, attempt, r.sub.MaxDeliver, r.sub.BackOff)
	switch s.act {
	case actAck:
		at.decide(OutcomeAck, s.class, "")
		r.count(OutcomeAck, s.class, resp.status)
		if err := msg.Ack(); err != nil {
			log().Warn("ack failed; JetStream will redeliver after AckWait", slog.Int("status", resp.status), slog.Any("error", err))
			return
		}
		if r.log.Enabled(ctx, slog.LevelDebug) {
			log().Debug("delivered", slog.Int("status", resp.status))
		}
	case actDeadLetter:
		if resp.status == http.StatusGone {
			log().Warn("endpoint answered 410 Gone: it says it no longer exists; every event of this subscription will be dead-lettered until its URL is fixed or the subscription removed")
		}
		r.giveUp(ctx, log(slog.Int("status", resp.status)), msg, deadletter.Letter{EventID: id, Attempt: attempt, Status: resp.status, Reason: s.reason, At: resp.at}, s.outcome, s.class)
	case actRetry:
		at.decide(OutcomeRetry, s.class, s.reason)
		r.count(OutcomeRetry, s.class, 0)
		l := log(slog.Int("status", resp.status))
		l.Warn("delivery failed, will retry", slog.String("reason", s.reason), slog.Duration("delay", s.delay))
		nak(l, msg, s.delay)
	}
}

// retryDelay is retryDelay with the subscription's backoff.
func (r *runner) retryDelay(attempt int, retryAfter time.Duration) time.Duration {
	return retryDelay(r.sub.BackOff, attempt, retryAfter)
}

// nak returns msg to JetStream for redelivery after delay, logging a
// failure to log.
func nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration) {
	if err := msg.NakWithDelay(delay); err != nil {
		log.Warn("nak failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}

// giveUp dead-letters msg and Terms it; if the dead letter cannot be stored
// it Naks msg with the backoff delay instead, also after the last attempt:
// the durable consumer has no server-side MaxDeliver, so the message comes
// back and is tried (and, failing, dead-lettered) again.
func (r *runner) giveUp(ctx context.Context, log *slog.Logger, msg jetstream.Msg, dl deadletter.Letter, outcome, class string) {
	dl.Subscription = r.sub.Name
	dl.Endpoint = r.endpoint
	dl.Msg = msg
	if r.deadLetters != nil {
		if err := r.deadLetters.DeadLetter(ctx, dl); err != nil {
			delay := r.retryDelay(dl.Attempt, -1)
			log.Error("dead letter failed; will retry the delivery", slog.String("reason", dl.Reason), slog.Any("error", err), slog.Duration("delay", delay))
			attemptOf(ctx).decide(OutcomeRetry, class, dl.Reason+" (dead letter failed: "+err.Error()+")")
			r.metrics.deliveries.WithLabelValues(r.sub.Name, OutcomeRetry, class).Inc()
			nak(log, msg, delay)
			return
		}
	}
	r.metrics.deliveries.WithLabelValues(r.sub.Name, outcome, class).Inc()
	attemptOf(ctx).decide(outcome, class, dl.Reason)
	if r.deadLetters != nil {
		r.metrics.deadLetters.WithLabelValues(r.sub.Name).Inc()
	}
	log.Error("delivery failed for good, terminated", slog.String("outcome", outcome), slog.String("reason", dl.Reason))
	if err := msg.TermWithReason(dl.Reason); err != nil {
		log.Warn("term failed; JetStream will redeliver after AckWait", slog.Any("error", err))
	}
}

// requestHeader returns a new request header holding the subscription's
// static headers (Subscription.Headers, User-Agent), with room for the
// per-delivery ones. The static values are shared between requests: the
// transport only reads them, and every header set per delivery (see
// reservedHeaders) replaces a value rather than appending to it.
func (r *runner) requestHeader() http.Header {
	h := make(http.Header, len(r.static)+8)
	for k, v := range r.static {
		h[k] = v
	}
	return h
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

// post sends one signed POST and reads the response. While it runs longer
// than AckWait/2 it calls inProgress (the message's InProgress) every
// AckWait/2 so JetStream does not redeliver; inProgress may be nil. hdr
// comes from requestHeader and buildBody.
func (r *runner) post(ctx context.Context, inProgress func() error, id string, body []byte, hdr http.Header) response {
	ctx, cancel := context.WithTimeout(ctx, r.sub.Timeout)
	defer cancel()
	if inProgress != nil {
		defer r.keepAlive(id, inProgress)()
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.sub.URL, bytes.NewReader(body))
	if err != nil {
		return response{err: fmt.Errorf("new request: %w", err), retryAfter: -1}
	}
	hdr[wire.HeaderIdempotencyKey] = []string{wire.IdempotencyKey(id)}
	req.Header = hdr
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(hdr)) // traceparent: the attempt's span
	r.signer.Sign(hdr, id, time.Now(), body)

	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		r.duration.Observe(time.Since(start).Seconds())
		var ne net.Error
		timeout := !errors.Is(err, ErrForbiddenAddress) && (errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()))
		return response{err: err, timeout: timeout, retryAfter: -1, at: start}
	}
	// Drain (a little of) the body so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	r.duration.Observe(time.Since(start).Seconds())
	return response{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), at: start}
}

// keepAlive calls inProgress every AckWait/2 until the returned stop is
// called. It costs one timer that never fires on a POST shorter than
// AckWait/2 (no goroutine waits for it).
func (r *runner) keepAlive(id string, inProgress func() error) (stop func()) {
	every := r.sub.AckWait / 2
	var mu sync.Mutex
	stopped := false
	var t clockwork.Timer
	mu.Lock()
	t = r.clock.AfterFunc(every, func() {
		if err := inProgress(); err != nil {
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
