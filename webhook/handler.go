package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/wire"
)

// DefaultMaxBodyBytes is the largest body Handler reads unless
// WithMaxBodyBytes says otherwise: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultLease is how long Handler holds an Idempotency-Key in progress
// while next runs, unless WithLease says otherwise: 1 minute.
const DefaultLease = time.Minute

// ProcessFunc handles one verified, first-seen webhook. body is the exact
// request body (r.Body is already consumed). A nil error acknowledges the
// delivery. On any error the Idempotency-Key is released and the sender sees
// a 500, which it retries, unless the error wraps a *StatusError choosing
// another status (a 4xx other than 408 and 429 makes the sender give up and
// dead-letter the event).
type ProcessFunc func(ctx context.Context, r *http.Request, body []byte) error

// StatusError is a ProcessFunc failure with the HTTP status Handler answers,
// e.g. &StatusError{Status: http.StatusUnprocessableEntity, Err: err} for an
// event the receiver can never handle. Status must be 4xx or 5xx; any other
// value answers 500.
type StatusError struct {
	// Status is the response status code.
	Status int
	// Err is the cause; it is logged, not sent.
	Err error
}

// Error returns the status and the cause.
func (e *StatusError) Error() string { return fmt.Sprintf("status %d: %v", e.Status, e.Err) }

// Unwrap returns the cause.
func (e *StatusError) Unwrap() error { return e.Err }

// HandlerOption configures Handler.
type HandlerOption func(*handler)

// WithMaxBodyBytes sets the largest accepted body in bytes (default
// DefaultMaxBodyBytes, 1 MiB); larger bodies get 413. n <= 0 keeps the
// default.
func WithMaxBodyBytes(n int64) HandlerOption {
	return func(h *handler) {
		if n > 0 {
			h.maxBody = n
		}
	}
}

// WithLease sets how long an Idempotency-Key stays in progress while next
// runs (default DefaultLease, 1 minute). next's context ends with the lease,
// so a handler that honours its context never outlives it; a retry arriving
// meanwhile gets 503 with Retry-After, and a receiver that crashes holds
// the key no longer than the lease. Keep it above your slowest handler and
// below the sender's retry envelope (see RetryProfile). d <= 0 keeps the
// default.
func WithLease(d time.Duration) HandlerOption {
	return func(h *handler) {
		if d > 0 {
			h.lease = d
		}
	}
}

// WithLogger sets the logger for rejected and failed deliveries (default
// slog.Default()). A nil logger keeps the default.
func WithLogger(l *slog.Logger) HandlerOption {
	return func(h *handler) {
		if l != nil {
			h.log = l
		}
	}
}

type handler struct {
	v       *Verifier
	store   IdempotencyStore
	ttl     time.Duration
	lease   time.Duration
	next    ProcessFunc
	maxBody int64
	log     *slog.Logger
	gate    *OrderGate // nil: ungated
}

// Handler returns the receiver middleware. ttl is how long a completed
// Idempotency-Key is remembered (derive it with MinSafeTTL). For each
// request it answers:
//
//   - 413 "body-too-large" over the limit (WithMaxBodyBytes), 422
//     "unreadable-body" when the body cannot be read;
//   - 401 with the reason when Verify fails: "missing-signature",
//     "missing-timestamp", "stale", "future" or "bad-signature";
//   - 400 "missing-idempotency-key" without an Idempotency-Key header, and
//     under SchemeStandard 400 "idempotency-key-mismatch" when it differs
//     from webhook-id: webhook-id is signed and the key is not, so this stops
//     a captured request from being replayed under a fresh key within the
//     signature tolerance (jsbridge sets both to the event id; under
//     SchemeHMACSHA256 nothing signed names the event, so dedup there relies
//     on the sender's key alone);
//   - 204 without calling next when the key is done (a duplicate);
//   - 503 "in-progress" with Retry-After (whole seconds until the other
//     attempt's lease ends, at least 1) when another attempt holds the key:
//     the sender retries, and by then the key is done (204) or released
//     (next runs);
//   - with WithOrderGate, the gate's answers (see OrderGate) for an ordered
//     delivery out of order, a duplicate version or a stale sender, and 401
//     "missing-order-signature" or "bad-order-signature" when its
//     Jsbridge-Order-Signature, checked with v, does not sign its ordering
//     fields;
//   - otherwise it claims the key for the lease (WithLease) and calls next
//     with a context ending with the lease. Success marks the key done for
//     ttl and answers 204. An error (or a panic, which is re-raised)
//     releases the key and answers 500 "processing-failed" so the retry runs
//     next again, or the status of a wrapped *StatusError (body
//     "rejected"). A store failure answers 500 "idempotency-store".
//
// Every status the sender must not retry is a 4xx other than 408/429; every
// status it must retry is 5xx (see the webhook contract in the design).
// Handler panics when v, store or next is nil or ttl <= 0: wiring errors.
func Handler(v *Verifier, store IdempotencyStore, ttl time.Duration, next ProcessFunc, opts ...HandlerOption) http.Handler {
	switch {
	case v == nil:
		panic("webhook.Handler: verifier is nil")
	case store == nil:
		panic("webhook.Handler: idempotency store is nil")
	case next == nil:
		panic("webhook.Handler: next is nil")
	case ttl <= 0:
		panic(fmt.Sprintf("webhook.Handler: ttl %v must be > 0", ttl))
	}
	h := &handler{v: v, store: store, ttl: ttl, lease: DefaultLease, next: next, maxBody: DefaultMaxBodyBytes, log: slog.Default()}
	for _, o := range opts {
		o(h)
	}
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			h.reject(ctx, w, r, http.StatusRequestEntityTooLarge, "body-too-large", err)
			return
		}
		h.reject(ctx, w, r, http.StatusUnprocessableEntity, "unreadable-body", err)
		return
	}
	if err := h.v.Verify(r.Header, body); err != nil {
		h.reject(ctx, w, r, http.StatusUnauthorized, Reason(err), err)
		return
	}
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	if key == "" {
		h.reject(ctx, w, r, http.StatusBadRequest, "missing-idempotency-key", errors.New("no Idempotency-Key header"))
		return
	}
	if id := r.Header.Get(HeaderWebhookID); h.v.Scheme() == SchemeStandard && id != key {
		h.reject(ctx, w, r, http.StatusBadRequest, "idempotency-key-mismatch", fmt.Errorf("Idempotency-Key %q differs from the signed webhook-id %q", key, id))
		return
	}
	if h.gate != nil {
		h.gate.serve(w, r, body, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.deduplicate(w, r, key, body) }), h.v)
		return
	}
	h.deduplicate(w, r, key, body)
}

// deduplicate claims key and runs next once per key: the half of ServeHTTP
// after verification (and after the order gate, when there is one).
func (h *handler) deduplicate(w http.ResponseWriter, r *http.Request, key string, body []byte) {
	ctx := r.Context()
	// The lease as this process counts it starts before the claim, so next's
	// deadline never passes the store's end of the lease.
	leaseEnd := time.Now().Add(h.lease)
	c, err := h.store.Claim(ctx, key, h.lease)
	if err != nil {
		h.log.ErrorContext(ctx, "webhook: claim idempotency key", "event_id", key, "err", err)
		http.Error(w, "idempotency-store", http.StatusInternalServerError)
		return
	}
	switch c.State {
	case ClaimDone:
		h.log.DebugContext(ctx, "webhook: duplicate delivery", "event_id", key)
		w.WriteHeader(http.StatusNoContent)
		return
	case ClaimInProgress:
		wait := max(1, int64(math.Ceil(c.Remaining.Seconds())))
		h.log.InfoContext(ctx, "webhook: delivery in progress elsewhere, asking for a retry", "event_id", key, "retry_after_s", wait)
		w.Header().Set("Retry-After", strconv.FormatInt(wait, 10))
		http.Error(w, "in-progress", http.StatusServiceUnavailable)
		return
	case ClaimWon:
	default:
		h.log.ErrorContext(ctx, "webhook: claim idempotency key", "event_id", key, "err", fmt.Errorf("unknown claim state %v", c.State))
		http.Error(w, "idempotency-store", http.StatusInternalServerError)
		return
	}
	if err := h.process(ctx, r, c, leaseEnd, body); err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Status >= 400 && se.Status <= 599 {
			h.log.WarnContext(ctx, "webhook: processing rejected", "event_id", key, "status", se.Status, "err", err)
			http.Error(w, "rejected", se.Status)
			return
		}
		h.log.ErrorContext(ctx, "webhook: processing failed", "event_id", key, "err", err)
		http.Error(w, "processing-failed", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// process calls next under the lease. On success it marks the key done;
// on an error or a panic it releases the key so the retry runs again (a key
// left in progress would turn every retry into a 503 until the lease ends).
func (h *handler) process(ctx context.Context, r *http.Request, c Claim, leaseEnd time.Time, body []byte) (err error) {
	// The store calls after next must happen even when the request context
	// is done (the sender gave up waiting).
	storeCtx := context.WithoutCancel(ctx)
	ok := false
	defer func() {
		if ok {
			return
		}
		if rerr := h.store.Release(storeCtx, c); rerr != nil {
			h.log.ErrorContext(ctx, "webhook: release idempotency key; a retry waits for the lease to end", "event_id", c.Key, "err", rerr)
		}
	}()
	leaseCtx, cancel := context.WithDeadline(ctx, leaseEnd)
	defer cancel()
	err = h.next(leaseCtx, r, body)
	if err != nil {
		return err
	}
	ok = true
	// The side effects ran: answer 204 even if the store cannot record it.
	// A 500 would bring a retry that finds the key still in progress and,
	// once the lease ends, runs the side effects a second time.
	if cerr := h.store.Complete(storeCtx, c, h.ttl); cerr != nil {
		h.log.ErrorContext(ctx, "webhook: complete idempotency key; a duplicate after the lease ends would run again", "event_id", c.Key, "err", cerr)
	}
	return nil
}

func (h *handler) reject(ctx context.Context, w http.ResponseWriter, r *http.Request, status int, reason string, err error) {
	h.log.WarnContext(ctx, "webhook: rejected", "status", status, "reason", reason, "event_id", r.Header.Get(wire.HeaderIdempotencyKey), "remote", r.RemoteAddr, "err", err)
	http.Error(w, reason, status)
}
