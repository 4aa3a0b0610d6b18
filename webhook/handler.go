package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// DefaultMaxBodyBytes is the largest body Handler reads unless
// WithMaxBodyBytes says otherwise: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

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
	next    ProcessFunc
	maxBody int64
	log     *slog.Logger
}

// Handler returns the receiver middleware. For each request it:
//
//  1. reads the body, at most the limit (413 when larger, 400 when the body
//     cannot be read);
//  2. verifies the signature with v (401, body = Reason: "missing-signature",
//     "missing-timestamp", "stale", "future" or "bad-signature");
//  3. takes the Idempotency-Key header (400 "missing-idempotency-key" when
//     absent) and claims it in store for ttl (500 when the store fails);
//     an already claimed key answers 204 without calling next;
//  4. calls next; success answers 204. An error (or a panic, which is
//     re-raised) releases the key and answers 500 "processing-failed" so
//     the sender retries, or the status of a wrapped *StatusError
//     (body "rejected").
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
	h := &handler{v: v, store: store, ttl: ttl, next: next, maxBody: DefaultMaxBodyBytes, log: slog.Default()}
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
		h.reject(ctx, w, r, http.StatusBadRequest, "unreadable-body", err)
		return
	}
	if err := h.v.Verify(r.Header, body); err != nil {
		h.reject(ctx, w, r, http.StatusUnauthorized, Reason(err), err)
		return
	}
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		h.reject(ctx, w, r, http.StatusBadRequest, "missing-idempotency-key", errors.New("no Idempotency-Key header"))
		return
	}
	first, err := h.store.Claim(ctx, key, h.ttl)
	if err != nil {
		h.log.ErrorContext(ctx, "webhook: claim idempotency key", "event_id", key, "err", err)
		http.Error(w, "idempotency-store", http.StatusInternalServerError)
		return
	}
	if !first {
		h.log.DebugContext(ctx, "webhook: duplicate delivery", "event_id", key)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := h.process(ctx, r, key, body); err != nil {
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

// process calls next; on an error or a panic it releases key so the retry
// runs again (a key left claimed would turn the retry into a silent drop).
func (h *handler) process(ctx context.Context, r *http.Request, key string, body []byte) (err error) {
	ok := false
	defer func() {
		if ok {
			return
		}
		// The request context may be done (client gone); the release must
		// still happen.
		if rerr := h.store.Release(context.WithoutCancel(ctx), key); rerr != nil {
			h.log.ErrorContext(ctx, "webhook: release idempotency key", "event_id", key, "err", rerr)
		}
	}()
	err = h.next(ctx, r, body)
	ok = err == nil
	return err
}

func (h *handler) reject(ctx context.Context, w http.ResponseWriter, r *http.Request, status int, reason string, err error) {
	h.log.WarnContext(ctx, "webhook: rejected", "status", status, "reason", reason, "event_id", r.Header.Get(HeaderIdempotencyKey), "remote", r.RemoteAddr, "err", err)
	http.Error(w, reason, status)
}
