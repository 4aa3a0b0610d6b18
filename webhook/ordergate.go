package webhook

import (
	"bytes"
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

// DefaultGateRetryAfter is the Retry-After an OrderGate sends with its 409
// answers unless WithGateRetryAfter says otherwise: 1 second.
const DefaultGateRetryAfter = time.Second

// OrderGate lets a receiver prove the order of an ordered subscription's
// webhooks instead of trusting it. Per stream (OrderKey) it keeps the last
// version it processed, L (or none), and the highest lease epoch
// processed, and follows the version chain each request carries: the
// stream (ce-subject, or "subject" of the JSON envelope in structured
// mode), the version v (ce-streamversion / "streamversion"), the source
// (ce-source / "source"), the previous version p this subscription
// delivered of the stream (wire.HeaderPreviousVersion, "none" for the
// first) and, from a partition's owner, wire.HeaderPartition and
// wire.HeaderLeaseEpoch (e). Replay paths (dead-letter replay, replay by
// time) are not owners and send neither: the gate then skips the epoch
// check, which the chain makes unnecessary, and keeps the stored epoch.
// It first refuses a malformed request (400) and, with a verifier, one
// whose ordering fields are not signed (401); then it answers, in this
// order:
//
//   - e present and below the highest epoch processed for the stream: 409
//     with Jsbridge-Order: stale-epoch, Retry-After and
//     wire.HeaderOrderEpoch naming that highest epoch (the sender raises
//     its epochs above it), the handler not called, whatever the version
//     (a zombie sender's late POST is never processed, nor acknowledged as
//     a duplicate);
//   - v <= L: 204 with Jsbridge-Order: duplicate, the handler not called;
//   - p == L (both none, or equal) while no other request of the stream is
//     being processed: the handler runs while the gate holds the stream; a
//     2xx answer records v (and e, when present) before it reaches the
//     sender (a store failure then answers 500 "order-store" instead, and
//     the retry finds v still next); any other answer records nothing and
//     passes through;
//   - p == L while another request of the stream is being processed: 409,
//     Jsbridge-Order: in-progress, Retry-After;
//   - any other p (ahead of L, or behind L while v > L): 409,
//     Jsbridge-Order: gap, Retry-After, and wire.HeaderOrderLast naming L
//     ("none" when the gate processed nothing of the stream), so the sender
//     and the operator see what the receiver has.
//
// A store that fails to lock the stream gets 500 "order-store" before any
// of these. The refusals before those: a bad header or attribute value, one of
// partition and epoch without the other, or p not below v: 400 naming the
// header and the value; with a verifier (WithGateVerifier, or the
// Handler's under WithOrderGate), a wire.HeaderOrderSignature missing or
// not signing the ordering fields read: 401 "missing-order-signature" or
// "bad-order-signature", never processed (Verifier.VerifyOrder).
//
// A request with partition and epoch but no previous version comes from a
// sender before the version chain: it is held to the former rule, v ==
// L+1, or 0 for a stream never processed (any v with WithGateFirstSeen). A
// request with no ordering header at all (an unordered subscription)
// passes through untouched, or gets 400 "missing-ordering-header" under
// WithGateRequireHeaders. The sender retries every 409 above in place and
// never dead-letters it (wire.OrderRetryInPlace).
//
// The gate belongs after signature verification and before deduplication:
// Handler(…, WithOrderGate(g)) runs it there; as a middleware (Middleware),
// put it behind your own verification and give it the verifier
// (WithGateVerifier) so that the ordering headers, which the body's
// signature does not cover, are checked too. It records only a 2xx of the
// handler it wraps, so placed in front of a verifying handler it still
// records nothing unverified. When the store's lock holds a transaction
// (package webhook/pgstore), the handler runs inside it: see
// ContextOrderLock.
type OrderGate struct {
	store      OrderStore
	namespace  string
	firstSeen  bool
	require    bool
	verifier   *Verifier // nil: ordering headers not checked (Middleware)
	retryAfter string    // whole seconds
	maxBody    int64
	log        *slog.Logger
}

// GateOption configures an OrderGate in NewOrderGate.
type GateOption func(*OrderGate)

// WithGateNamespace scopes every OrderKey of the gate by ns (default ""):
// give each ordered subscription delivering to this receiver its own
// namespace (e.g. its path), since their lease epochs are not comparable.
func WithGateNamespace(ns string) GateOption {
	return func(g *OrderGate) { g.namespace = ns }
}

// WithGateFirstSeen lets the first request the gate sees of a stream start
// it, whatever its previous version, for a gate added to a receiver that
// already processed events, or over a store that lost its records (the
// memory store after a restart). By default a stream never processed
// starts with the request whose previous version is none (version 0, or
// the first event of a start: new or time-window subscription; for a
// sender before the chain, version 0), so order is provable from the
// start. Versions below the first processed one then count as duplicates.
func WithGateFirstSeen() GateOption {
	return func(g *OrderGate) { g.firstSeen = true }
}

// WithGateRequireHeaders refuses, with 400 "missing-ordering-header", a
// request without Jsbridge-Previous-Version (the version chain), for an
// endpoint only ordered subscriptions may deliver to: replays, which carry
// the chain but no partition or epoch, pass. By default a request with no
// ordering header passes through to the handler untouched, and one from a
// sender before the chain (partition and epoch only) is held to last+1.
func WithGateRequireHeaders() GateOption {
	return func(g *OrderGate) { g.require = true }
}

// WithGateVerifier makes Middleware check each ordered request's
// Jsbridge-Order-Signature with v (Verifier.VerifyOrder): a request whose
// ordering fields are unsigned or altered is refused 401 and never
// processed. v must verify the subscription's scheme and secrets, as the
// body's verifier does. Under Handler(…, WithOrderGate(g)) the Handler's
// verifier is used and this option is not needed. A nil v checks nothing
// (the default for Middleware).
func WithGateVerifier(v *Verifier) GateOption {
	return func(g *OrderGate) { g.verifier = v }
}

// WithGateRetryAfter sets the Retry-After of the gate's 409 answers (default
// DefaultGateRetryAfter, 1 s), rounded up to whole seconds. d <= 0 keeps the
// default.
func WithGateRetryAfter(d time.Duration) GateOption {
	return func(g *OrderGate) {
		if d > 0 {
			g.retryAfter = strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
		}
	}
}

// WithGateMaxBodyBytes sets the largest structured-mode body Middleware reads
// to find the version (default DefaultMaxBodyBytes, 1 MiB); larger bodies
// get 413. n <= 0 keeps the default. Handler's own limit applies under
// WithOrderGate.
func WithGateMaxBodyBytes(n int64) GateOption {
	return func(g *OrderGate) {
		if n > 0 {
			g.maxBody = n
		}
	}
}

// WithGateLogger sets the logger for the gate's refusals and store failures
// (default slog.Default()). A nil logger keeps the default.
func WithGateLogger(l *slog.Logger) GateOption {
	return func(g *OrderGate) {
		if l != nil {
			g.log = l
		}
	}
}

// NewOrderGate returns a gate keeping its positions in store. It panics when
// store is nil: a wiring error.
func NewOrderGate(store OrderStore, opts ...GateOption) *OrderGate {
	if store == nil {
		panic("webhook.NewOrderGate: order store is nil")
	}
	g := &OrderGate{store: store, retryAfter: "1", maxBody: DefaultMaxBodyBytes, log: slog.Default()}
	for _, o := range opts {
		o(g)
	}
	return g
}

// WithOrderGate runs g inside Handler, after the signature and
// Idempotency-Key checks and before the idempotency claim: verify → order
// gate (checking the order signature with Handler's verifier) →
// deduplicate → next. When g's store holds a transaction
// (webhook/pgstore), the claim and next run in it. A nil g keeps Handler
// ungated.
func WithOrderGate(g *OrderGate) HandlerOption {
	return func(h *handler) { h.gate = g }
}

// Middleware returns next behind the gate, as a func(http.Handler)
// http.Handler middleware. It reads a structured-mode body (up to
// WithGateMaxBodyBytes) to find the version and hands next an identical one.
func (g *OrderGate) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasOrderHeaders(r.Header) {
			g.serve(w, r, nil, next, g.verifier)
			return
		}
		var body []byte
		if isStructured(r.Header) {
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
			if err != nil {
				if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
					g.refuse(w, r, http.StatusRequestEntityTooLarge, "body-too-large", err)
					return
				}
				g.refuse(w, r, http.StatusUnprocessableEntity, "unreadable-body", err)
				return
			}
			body = b
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		g.serve(w, r, body, next, g.verifier)
	})
}

// serve gates one request; body is the request body when it is structured
// (nil otherwise), already read; v, when not nil, checks the order
// signature.
func (g *OrderGate) serve(w http.ResponseWriter, r *http.Request, body []byte, handler http.Handler, v *Verifier) {
	if !hasOrderHeaders(r.Header) || (g.require && r.Header.Get(wire.HeaderPreviousVersion) == "") {
		if g.require {
			g.refuse(w, r, http.StatusBadRequest, "missing-ordering-header",
				fmt.Errorf("no %s header: not an ordered delivery of the version chain", wire.HeaderPreviousVersion))
			return
		}
		handler.ServeHTTP(w, r)
		return
	}
	req, err := parseOrderRequest(r.Header, body)
	if err != nil {
		g.refuse(w, r, http.StatusBadRequest, err.Error(), err)
		return
	}
	if v != nil {
		if err := v.VerifyOrder(r.Header, req.fields()); err != nil {
			g.refuse(w, r, http.StatusUnauthorized, Reason(err), err)
			return
		}
	}
	ctx := r.Context()
	key := OrderKey{Namespace: g.namespace, Source: req.source, Stream: req.stream}
	attrs := []any{"stream", key.Stream, "source", key.Source, "namespace", key.Namespace, "version", req.version,
		"previous", req.fields().Previous, "epoch", req.epoch}
	pos, lock, err := g.store.Lock(ctx, key)
	if err != nil {
		g.log.ErrorContext(ctx, "webhook: lock stream in order store", append(attrs, "err", err)...)
		http.Error(w, "order-store", http.StatusInternalServerError)
		return
	}
	// The store calls after next must happen even when the sender gave up.
	storeCtx := context.WithoutCancel(ctx)
	if lock != nil {
		defer func() {
			if err := lock.Release(storeCtx); err != nil {
				g.log.ErrorContext(ctx, "webhook: release stream in order store", append(attrs, "err", err)...)
			}
		}()
	}
	verdict := decideOrder(pos, lock != nil, req, g.firstSeen)
	if verdict != wire.OrderDuplicate && verdict != wire.OrderStaleEpoch && req.hasPrevious && req.previous >= req.version {
		// A chain whose previous version is not below its version is
		// malformed; checked after the position so that a redelivery of a
		// version already processed is still answered duplicate.
		err := fmt.Errorf("bad %s %d: not below the stream version %d", wire.HeaderPreviousVersion, req.previous, req.version)
		g.refuse(w, r, http.StatusBadRequest, err.Error(), err)
		return
	}
	if verdict != wire.OrderDuplicate && verdict != "" {
		g.log.InfoContext(ctx, "webhook: order gate refused a delivery; the sender retries it",
			append(attrs, "order", verdict, "last_version", pos.Version, "last_epoch", pos.Epoch)...)
	}
	switch verdict {
	case wire.OrderDuplicate:
		w.Header().Set(wire.HeaderOrder, wire.OrderDuplicate)
		w.WriteHeader(http.StatusNoContent)
		return
	case wire.OrderGap, wire.OrderInProgress, wire.OrderStaleEpoch:
		last := wire.FormatPreviousVersion(pos.Version)
		w.Header().Set(wire.HeaderOrder, verdict)
		if verdict == wire.OrderGap {
			w.Header().Set(wire.HeaderOrderLast, last)
		}
		if verdict == wire.OrderStaleEpoch {
			// The sender raises its epochs above this one (wire.HeaderOrderEpoch).
			w.Header().Set(wire.HeaderOrderEpoch, strconv.FormatUint(pos.Epoch, 10))
		}
		w.Header().Set("Retry-After", g.retryAfter)
		http.Error(w, fmt.Sprintf("%s: stream %q version %d previous %s epoch %d; last processed version %s epoch %d",
			verdict, req.stream, req.version, wire.FormatPreviousVersion(req.fields().Previous), req.epoch, last, pos.Epoch), http.StatusConflict)
		return
	}
	// A request from a replay path (no partition or epoch) keeps the
	// stream's epoch and partition: it proves nothing about owners.
	next := OrderPosition{Version: req.version, Epoch: pos.Epoch, Partition: pos.Partition}
	if req.owner {
		next.Epoch, next.Partition = req.epoch, req.partition
	}
	ow := &orderWriter{ResponseWriter: w, commit: func() error { return lock.Advance(storeCtx, next) }}
	if cl, ok := lock.(ContextOrderLock); ok {
		r = r.WithContext(cl.WithLock(ctx))
	}
	handler.ServeHTTP(ow, r)
	ow.finish()
	if ow.err != nil {
		g.log.ErrorContext(ctx, "webhook: record stream position; answered 500 so the sender retries", append(attrs, "err", ow.err)...)
	}
}

// decideOrder is the gate's rule, a function of values: what to do with req
// given the stream's recorded position, whether the caller holds the
// stream, and whether a stream never processed may start anywhere. It
// returns "" to process, or the wire.HeaderOrder value to answer.
func decideOrder(pos OrderPosition, held bool, req orderRequest, firstSeen bool) string {
	if req.owner && req.epoch < pos.Epoch {
		return wire.OrderStaleEpoch
	}
	if pos.Version >= 0 && req.version <= pos.Version {
		return wire.OrderDuplicate
	}
	var next bool
	switch {
	case pos.Version < 0 && firstSeen:
		next = true // the first version seen starts the stream
	case req.hasPrevious:
		next = req.previous == pos.Version // the chain: -1 is none on both sides
	default:
		next = req.version == pos.Version+1 // a sender before the chain
	}
	switch {
	case !next:
		return wire.OrderGap
	case !held:
		return wire.OrderInProgress
	}
	return ""
}

func (g *OrderGate) refuse(w http.ResponseWriter, r *http.Request, status int, reason string, err error) {
	g.log.WarnContext(r.Context(), "webhook: order gate rejected a request", "status", status, "event_id", r.Header.Get(wire.HeaderIdempotencyKey), "err", err)
	http.Error(w, reason, status)
}
