package jsbridgetest

import (
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// DefaultWait is how long the waiting helpers (Receiver.WaitFor,
// Receiver.RequireStream) wait before they fail the test: 30 s, room for
// a loaded CI machine; each returns as soon as its condition holds.
const DefaultWait = 30 * time.Second

// Delivery is one webhook request the Receiver accepted: its signature
// verified, its CloudEvent decoded.
type Delivery struct {
	// EventID is the event id (CloudEvents id).
	EventID string
	// IdempotencyKey is the Idempotency-Key header as sent.
	IdempotencyKey string
	// Stream is the source stream (CloudEvents subject), e.g. "order-42".
	Stream string
	// Version is the event's version in its stream.
	Version int64
	// Type is the event name, e.g. "OrderPlaced".
	Type string
	// Data is the event data, byte for byte.
	Data []byte
	// Header is the request's header, signature headers included.
	Header http.Header
	// Body is the request body, byte for byte.
	Body []byte
	// Received is when the receiver accepted it.
	Received time.Time
}

// ReceiverConfig configures a Receiver. The zero value works.
type ReceiverConfig struct {
	// Scheme is the signature scheme verified. Default
	// webhook.SchemeStandard.
	Scheme webhook.Scheme
	// Secrets verify the signatures; the consumer must sign with one of
	// them. Default: one fresh whsec_ secret (Receiver.Secret) under
	// SchemeStandard; required for SchemeHMACSHA256.
	Secrets []string
	// Respond, when set, chooses the status of each verified request
	// (e.g. 500 to make the consumer retry, 422 to dead-letter); a status
	// outside 2xx is not recorded as delivered but counted in Attempts.
	// Default: 204 for every request.
	Respond func(Delivery) int
}

// Receiver is a recording webhook endpoint on an httptest server: it
// verifies each request's signature with package webhook (answering 401
// with the reason when it fails), decodes the CloudEvent and records it.
// Its methods are safe for concurrent use.
type Receiver struct {
	srv      *httptest.Server
	verifier *webhook.Verifier
	secrets  []string
	respond  func(Delivery) int

	mu        sync.Mutex
	delivered []Delivery
	attempts  int
	rejected  []string // verification failures' reasons
	changed   chan struct{}
}

// NewReceiver starts a Receiver, closed at the test's cleanup. It fails
// the test when cfg's secrets do not parse for its scheme.
func NewReceiver(t testing.TB, cfg ReceiverConfig) *Receiver {
	t.Helper()
	if cfg.Scheme == "" {
		cfg.Scheme = webhook.SchemeStandard
	}
	if len(cfg.Secrets) == 0 && cfg.Scheme == webhook.SchemeStandard {
		cfg.Secrets = []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte(rand.Text()))}
	}
	v, err := webhook.NewVerifier(cfg.Scheme, cfg.Secrets)
	if err != nil {
		t.Fatalf("jsbridgetest: receiver: %v", err)
	}
	r := &Receiver{verifier: v, secrets: cfg.Secrets, respond: cfg.Respond, changed: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the endpoint to POST to (plain http on loopback: a subscription
// to it needs AllowPrivate).
func (r *Receiver) URL() string { return r.srv.URL }

// Secrets returns the secrets the receiver verifies with.
func (r *Receiver) Secrets() []string { return slices.Clone(r.secrets) }

// Scheme returns the signature scheme the receiver verifies.
func (r *Receiver) Scheme() webhook.Scheme { return r.verifier.Scheme() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, "unreadable body", http.StatusBadRequest)
		return
	}
	if err := r.verifier.Verify(req.Header, body); err != nil {
		r.record(func() { r.rejected = append(r.rejected, webhook.Reason(err)) })
		http.Error(w, webhook.Reason(err), http.StatusUnauthorized)
		return
	}
	ce, err := webhook.DecodeCloudEvent(req, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	d := Delivery{
		EventID: ce.ID, IdempotencyKey: req.Header.Get(wire.HeaderIdempotencyKey), Stream: ce.Subject,
		Version: ce.StreamVersion, Type: ce.Type, Data: ce.Data, Header: req.Header.Clone(), Body: body, Received: time.Now(),
	}
	status := http.StatusNoContent
	if r.respond != nil {
		status = r.respond(d)
	}
	r.record(func() {
		r.attempts++
		if status >= 200 && status < 300 {
			r.delivered = append(r.delivered, d)
		}
	})
	w.WriteHeader(status)
}

// record applies change under the lock and wakes the waiters.
func (r *Receiver) record(change func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	change()
	close(r.changed)
	r.changed = make(chan struct{})
}

// Deliveries returns the deliveries accepted so far (verified, answered
// 2xx), in the order they arrived; a redelivered event appears again.
func (r *Receiver) Deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.delivered)
}

// Attempts returns how many verified requests arrived, whatever the
// answer (see ReceiverConfig.Respond).
func (r *Receiver) Attempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// Rejected returns the reasons of the requests whose signature did not
// verify (webhook.Reason: "missing-signature", "bad-signature", ...).
func (r *Receiver) Rejected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rejected)
}

// wait polls cond under the lock until it returns true (and returns its
// result) or DefaultWait passes (then it fails the test with msg).
func wait[T any](t testing.TB, r *Receiver, msg func() string, cond func() (T, bool)) T {
	t.Helper()
	deadline := time.NewTimer(DefaultWait)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		v, ok := cond()
		changed := r.changed
		r.mu.Unlock()
		if ok {
			return v
		}
		select {
		case <-changed:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("jsbridgetest: after %s: %s; received %s", DefaultWait, msg(), r.summary())
		}
	}
}

// summary lists what arrived, for failure messages; r.mu is held.
func (r *Receiver) summary() string {
	var b strings.Builder
	b.WriteString("[")
	for i, d := range r.delivered {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(d.Stream + "/" + d.EventID)
	}
	b.WriteString("]")
	if len(r.rejected) > 0 {
		b.WriteString(", rejected signatures: " + strings.Join(r.rejected, ","))
	}
	return b.String()
}

// WaitFor waits until event id was delivered and returns its first
// delivery; it fails the test after DefaultWait.
func (r *Receiver) WaitFor(t testing.TB, eventID string) Delivery {
	t.Helper()
	return wait(t, r, func() string { return "event " + eventID + " not delivered" }, func() (Delivery, bool) {
		for _, d := range r.delivered {
			if d.EventID == eventID {
				return d, true
			}
		}
		return Delivery{}, false
	})
}

// RequireStream waits until stream's deliveries are exactly eventIDs, in
// that order (each once: a redelivery of an event already delivered, or an
// event out of order, fails the test at once), and returns them. It fails
// the test after DefaultWait when they are still incomplete.
func (r *Receiver) RequireStream(t testing.TB, stream string, eventIDs ...string) []Delivery {
	t.Helper()
	var bad string
	got := wait(t, r, func() string {
		return "stream " + stream + ": want events " + strings.Join(eventIDs, ",") + " in order"
	}, func() ([]Delivery, bool) {
		var ds []Delivery
		for _, d := range r.delivered {
			if d.Stream == stream {
				ds = append(ds, d)
			}
		}
		for i, d := range ds {
			if i >= len(eventIDs) || d.EventID != eventIDs[i] {
				bad = "delivery " + d.EventID + " at position " + strconv.Itoa(i) + " of stream " + stream + "; want events " + strings.Join(eventIDs, ",") + " in order, each once"
				return ds, true
			}
		}
		return ds, len(ds) == len(eventIDs)
	})
	if bad != "" {
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("jsbridgetest: %s; received %s", bad, r.summary())
	}
	return got
}
