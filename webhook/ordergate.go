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
// webhooks instead of trusting it: per stream (OrderKey) it processes
// version last+1 only, once, and never for a sender whose lease epoch is
// below one it processed. It reads the stream version (ce-streamversion, or
// "streamversion" of the JSON envelope in structured mode), the stream id
// (ce-subject / "subject"), the source (ce-source / "source"), and the
// ordered-delivery headers wire.HeaderPartition and wire.HeaderLeaseEpoch.
// For a request carrying them it answers:
//
//   - epoch below the highest epoch processed for the stream: 409 with
//     Jsbridge-Order: stale-epoch, Jsbridge-Order-Epoch (that highest
//     epoch, wire.HeaderOrderEpoch) and Retry-After, the handler not
//     called, whatever the version (a zombie sender's late POST is never
//     processed);
//   - version <= the last processed: 204 with Jsbridge-Order: duplicate, the
//     handler not called;
//   - version == the next expected (last + 1; for a stream never processed,
//     0, or with WithGateFirstSeen any version) while no other request of
//     the stream is being processed: the handler runs while the gate holds
//     the stream; a 2xx answer records the version and epoch before it
//     reaches the sender (a store failure then answers 500 "order-store"
//     instead, and the retry finds the version still next); any other
//     answer records nothing and passes through;
//   - the next expected version while another request of the stream is
//     being processed: 409, Jsbridge-Order: in-progress, Retry-After;
//   - a version above the next expected (a gap, or one whose predecessor is
//     being processed right now): 409, Jsbridge-Order: gap, Retry-After;
//   - a bad header or attribute value, or one of the two ordering headers
//     without the other: 400 naming the header and the value;
//   - the lock failing in the store: 500 "order-store".
//
// A request with neither ordering header (an unordered subscription) passes
// through untouched, or gets 400 "missing-ordering-header" under
// WithGateRequireHeaders. The sender retries every 409 above in place and
// never dead-letters it (wire.OrderRetryInPlace).
//
// The gate belongs after signature verification and before deduplication:
// Handler(…, WithOrderGate(g)) runs it there; as a middleware (Middleware),
// put it behind your own verification. It records only a 2xx of the handler
// it wraps, so placed in front of a verifying handler it still records
// nothing unverified. The ordering headers, and the ce-* headers of binary
// mode, are outside the signature: prefer structured mode, where the version
// and stream come from the signed body.
type OrderGate struct {
	store      OrderStore
	namespace  string
	firstSeen  bool
	require    bool
	retryAfter string // whole seconds
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

// WithGateFirstSeen lets the first version the gate sees of a stream start
// it, for a subscription that starts mid-history (deliver_policy new or by
// time) or a gate added to a running receiver. By default a stream never
// processed must start at version 0, so order is provable from the start.
// Versions below the first processed one then count as duplicates.
func WithGateFirstSeen() GateOption {
	return func(g *OrderGate) { g.firstSeen = true }
}

// WithGateRequireHeaders refuses, with 400 "missing-ordering-header", a
// request carrying neither Jsbridge-Partition nor Jsbridge-Lease-Epoch,
// for an endpoint only ordered subscriptions may deliver to. By default
// such a request passes through to the handler untouched.
func WithGateRequireHeaders() GateOption {
	return func(g *OrderGate) { g.require = true }
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
// gate → deduplicate → next. A nil g keeps Handler ungated.
func WithOrderGate(g *OrderGate) HandlerOption {
	return func(h *handler) { h.gate = g }
}

// Middleware returns next behind the gate, as a func(http.Handler)
// http.Handler middleware. It reads a structured-mode body (up to
// WithGateMaxBodyBytes) to find the version and hands next an identical one.
func (g *OrderGate) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasOrderHeaders(r.Header) {
			g.serve(w, r, nil, next)
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
		g.serve(w, r, body, next)
	})
}

// serve gates one request; body is the request body when it is structured
// (nil otherwise), already read.
func (g *OrderGate) serve(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) {
	if !hasOrderHeaders(r.Header) {
		if g.require {
			g.refuse(w, r, http.StatusBadRequest, "missing-ordering-header",
				fmt.Errorf("no %s or %s header: not an ordered delivery", wire.HeaderPartition, wire.HeaderLeaseEpoch))
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	req, err := parseOrderRequest(r.Header, body)
	if err != nil {
		g.refuse(w, r, http.StatusBadRequest, err.Error(), err)
		return
	}
	ctx := r.Context()
	key := OrderKey{Namespace: g.namespace, Source: req.source, Stream: req.stream}
	attrs := []any{"stream", key.Stream, "source", key.Source, "namespace", key.Namespace, "version", req.version, "epoch", req.epoch}
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
		w.Header().Set(wire.HeaderOrder, verdict)
		if verdict == wire.OrderStaleEpoch {
			// The sender raises its epochs above this one (wire.HeaderOrderEpoch).
			w.Header().Set(wire.HeaderOrderEpoch, strconv.FormatUint(pos.Epoch, 10))
		}
		w.Header().Set("Retry-After", g.retryAfter)
		http.Error(w, fmt.Sprintf("%s: stream %q version %d epoch %d; last processed version %d epoch %d",
			verdict, req.stream, req.version, req.epoch, pos.Version, pos.Epoch), http.StatusConflict)
		return
	}
	ow := &orderWriter{ResponseWriter: w, commit: func() error {
		return lock.Advance(storeCtx, OrderPosition{Version: req.version, Epoch: req.epoch, Partition: req.partition})
	}}
	next.ServeHTTP(ow, r)
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
	if req.epoch < pos.Epoch {
		return wire.OrderStaleEpoch
	}
	if pos.Version >= 0 && req.version <= pos.Version {
		return wire.OrderDuplicate
	}
	next := pos.Version + 1
	if pos.Version < 0 && firstSeen {
		next = req.version
	}
	switch {
	case req.version > next:
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
