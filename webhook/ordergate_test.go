package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/ordertest"
	"github.com/jsbridge/jsbridge/wire"
)

func TestMemoryOrderStore(t *testing.T) {
	t.Parallel()
	ordertest.Run(t, func(*testing.T) webhook.OrderStore { return webhook.NewMemoryOrderStore() })
}

var quietGate = webhook.WithGateLogger(slog.New(slog.DiscardHandler))

// countingHandler answers 204 and counts its calls.
type countingHandler struct {
	mu    sync.Mutex
	calls int
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (c *countingHandler) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func do(t *testing.T, srv *httptest.Server, h http.Header, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(bytes.TrimSpace(got))
}

// binary returns the headers of a binary-mode ordered webhook.
func binary(stream, version, partition, epoch string) http.Header {
	h := http.Header{}
	h.Set(wire.HeaderSpecVersion, event.SpecVersion)
	h.Set(wire.HeaderID, "1")
	h.Set(wire.HeaderSource, "/shop")
	h.Set(wire.HeaderType, "OrderPlaced")
	h.Set(wire.HeaderContentType, event.ContentTypeJSON)
	for name, v := range map[string]string{wire.HeaderSubject: stream, wire.HeaderStreamVersion: version,
		wire.HeaderPartition: partition, wire.HeaderLeaseEpoch: epoch} {
		if v != "" {
			h.Set(name, v)
		}
	}
	return h
}

// TestOrderGateBinaryMode: in binary mode the gate reads the stream and
// version from the ce-* headers (percent-decoded).
func TestOrderGateBinaryMode(t *testing.T) {
	t.Parallel()
	store := webhook.NewMemoryOrderStore()
	next := &countingHandler{}
	srv := httptest.NewServer(webhook.NewOrderGate(store, quietGate).Middleware(next))
	t.Cleanup(srv.Close)
	status, _, body := do(t, srv, binary("order%2042", "0", "3", "12"), `{}`)
	require.Equal(t, http.StatusNoContent, status, body)
	status, h, _ := do(t, srv, binary("order%2042", "2", "3", "12"), `{}`)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, wire.OrderGap, h.Get(wire.HeaderOrder))
	pos, err := store.Position(context.Background(), webhook.OrderKey{Source: "/shop", Stream: "order 42"})
	require.NoError(t, err)
	require.Equal(t, webhook.OrderPosition{Version: 0, Epoch: 12, Partition: 3}, pos)
	require.Equal(t, 1, next.count())
}

// TestOrderGateBadRequests: a bad or missing value gets 400 naming the
// header (or attribute) and the value; the handler is not called.
func TestOrderGateBadRequests(t *testing.T) {
	t.Parallel()
	next := &countingHandler{}
	srv := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate).Middleware(next))
	t.Cleanup(srv.Close)
	structured := func(partition, epoch, body string) http.Header {
		h := http.Header{}
		h.Set(wire.HeaderContentType, event.ContentTypeCloudEventsJSON+"; charset=utf-8")
		h.Set(wire.HeaderPartition, partition)
		h.Set(wire.HeaderLeaseEpoch, epoch)
		return h
	}
	for _, c := range []struct {
		name string
		h    http.Header
		body string
		want []string
	}{
		{"bad partition", binary("s", "0", "x1", "5"), "", []string{wire.HeaderPartition, `"x1"`}},
		{"negative partition", binary("s", "0", "-1", "5"), "", []string{wire.HeaderPartition, `"-1"`}},
		{"bad epoch", binary("s", "0", "1", "-5"), "", []string{wire.HeaderLeaseEpoch, `"-5"`}},
		{"epoch without partition", binary("s", "0", "", "5"), "", []string{"missing " + wire.HeaderPartition}},
		{"partition without epoch", binary("s", "0", "2", ""), "", []string{"missing " + wire.HeaderLeaseEpoch}},
		{"bad version", binary("s", "v1", "1", "5"), "", []string{wire.HeaderStreamVersion, `"v1"`}},
		{"negative version", binary("s", "-2", "1", "5"), "", []string{"streamversion", "-2"}},
		{"no version", binary("s", "", "1", "5"), "", []string{"missing " + wire.HeaderStreamVersion}},
		{"no subject", binary("", "0", "1", "5"), "", []string{"missing " + wire.HeaderSubject}},
		{"structured, bad version", structured("1", "5", ""), `{"source":"/s","subject":"s","streamversion":"1"}`, []string{`"streamversion" "1"`}},
		{"structured, no version", structured("1", "5", ""), `{"source":"/s","subject":"s"}`, []string{`missing attribute "streamversion"`}},
		{"structured, no subject", structured("1", "5", ""), `{"source":"/s","streamversion":0}`, []string{`missing attribute "subject"`}},
		{"structured, no source", structured("1", "5", ""), `{"subject":"s","streamversion":0}`, []string{`missing attribute "source"`}},
		{"structured, not JSON", structured("1", "5", ""), `{`, []string{"bad structured body"}},
	} {
		status, _, body := do(t, srv, c.h, c.body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", c.name, body)
		for _, w := range c.want {
			require.Contains(t, body, w, c.name)
		}
	}
	require.Zero(t, next.count())
}

// TestOrderGateUnordered: a request without the ordering headers passes
// through untouched by default, and gets 400 under WithGateRequireHeaders.
func TestOrderGateUnordered(t *testing.T) {
	t.Parallel()
	store := webhook.NewMemoryOrderStore()
	var got []byte
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
	})
	loose := httptest.NewServer(webhook.NewOrderGate(store, quietGate).Middleware(next))
	t.Cleanup(loose.Close)
	strict := httptest.NewServer(webhook.NewOrderGate(store, quietGate, webhook.WithGateRequireHeaders()).Middleware(next))
	t.Cleanup(strict.Close)

	h := binary("s", "5", "", "")
	status, _, _ := do(t, loose, h, `{"n":1}`)
	require.Equal(t, http.StatusAccepted, status, "an unordered delivery reaches the handler")
	require.Equal(t, `{"n":1}`, string(got))
	require.Zero(t, store.Len(), "and is not recorded")

	got = nil
	status, _, body := do(t, strict, h, `{"n":1}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "missing-ordering-header", body)
	require.Nil(t, got)
}

// TestOrderGateRetryAfter: the option sets the 409s' Retry-After in whole
// seconds, rounded up.
func TestOrderGateRetryAfter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate,
		webhook.WithGateRetryAfter(2500*time.Millisecond)).Middleware(&countingHandler{}))
	t.Cleanup(srv.Close)
	status, h, _ := do(t, srv, binary("s", "1", "0", "1"), "")
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "3", h.Get("Retry-After"))
}

// failingAdvance is a store whose Advance fails the first n times.
type failingAdvance struct {
	webhook.OrderStore
	mu sync.Mutex
	n  int
}

type failingLock struct {
	webhook.OrderLock
	s *failingAdvance
}

func (f *failingAdvance) Lock(ctx context.Context, key webhook.OrderKey) (webhook.OrderPosition, webhook.OrderLock, error) {
	pos, lock, err := f.OrderStore.Lock(ctx, key)
	if lock == nil {
		return pos, nil, err
	}
	return pos, failingLock{lock, f}, err
}

func (l failingLock) Advance(ctx context.Context, pos webhook.OrderPosition) error {
	l.s.mu.Lock()
	fail := l.s.n > 0
	l.s.n--
	l.s.mu.Unlock()
	if fail {
		_ = l.Release(ctx)
		return errors.New("disk on fire")
	}
	return l.OrderLock.Advance(ctx, pos)
}

// TestOrderGateInHandler: under Handler the gate runs after verification
// (an unsigned request is refused 401 and records nothing) and before
// deduplication. A store failure while recording answers 500 although the
// handler ran; the sender's retry finds the version still next, the
// idempotency store answers it as a duplicate, and the gate records it.
func TestOrderGateInHandler(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	signer, err := webhook.NewSigner(webhook.SchemeStandard, secret)
	require.NoError(t, err)
	mem := webhook.NewMemoryOrderStore()
	store := &failingAdvance{OrderStore: mem}
	var mu sync.Mutex
	var handled []int64
	next := func(_ context.Context, r *http.Request, body []byte) error {
		ce, err := webhook.DecodeCloudEvent(r, body)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, ce.StreamVersion)
		return nil
	}
	srv := httptest.NewServer(webhook.Handler(v, webhook.NewMemoryStore(0), time.Hour, next,
		webhook.WithLogger(slog.New(slog.DiscardHandler)), webhook.WithOrderGate(webhook.NewOrderGate(store, quietGate))))
	t.Cleanup(srv.Close)
	post := func(id, version string, sign bool) (int, http.Header, string) {
		h := binary("order-1", version, "0", "4")
		h.Set(wire.HeaderIdempotencyKey, id)
		if sign {
			now := time.Now()
			v, err := strconv.ParseInt(version, 10, 64)
			require.NoError(t, err)
			signer.Sign(h, id, now, []byte(`{}`))
			signer.SignOrder(h, id, now, webhook.OrderFields{Stream: "order-1", Version: v, Previous: v - 1, Partition: 0, Epoch: 4})
		}
		return do(t, srv, h, `{}`)
	}
	key := webhook.OrderKey{Source: "/shop", Stream: "order-1"}
	position := func() int64 {
		pos, err := mem.Position(context.Background(), key)
		require.NoError(t, err)
		return pos.Version
	}

	status, _, body := post("e0", "0", false)
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.Equal(t, int64(-1), position(), "nothing unverified is recorded")

	// A sender before the chain signs the body only: the ordering fields
	// are unsigned, and refused.
	h := binary("order-1", "0", "0", "4")
	h.Set(wire.HeaderIdempotencyKey, "e0")
	signer.Sign(h, "e0", time.Now(), []byte(`{}`))
	status, _, body = do(t, srv, h, `{}`)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "missing-order-signature", body)
	require.Equal(t, int64(-1), position(), "nothing unsigned is recorded")

	store.n = 1
	status, _, body = post("e0", "0", true)
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, "order-store", body)
	require.Equal(t, int64(-1), position())
	status, _, _ = post("e0", "0", true) // the sender's retry
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, int64(0), position(), "the idempotent duplicate is recorded")

	status, h, _ = post("e2", "2", true)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, wire.OrderGap, h.Get(wire.HeaderOrder))
	status, _, _ = post("e1", "1", true)
	require.Equal(t, http.StatusNoContent, status)
	status, _, _ = post("e2", "2", true)
	require.Equal(t, http.StatusNoContent, status)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int64{0, 1, 2}, handled, "each version handled once, in order")
}

// TestReceiverDocListsEveryAnswer: docs/receiver.md's answers table names
// every Jsbridge-Order value the gate sends, the order signature's
// refusals, and the ordering headers.
func TestReceiverDocListsEveryAnswer(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/receiver.md")
	require.NoError(t, err)
	for _, v := range []string{wire.OrderDuplicate, wire.OrderGap, wire.OrderInProgress, wire.OrderStaleEpoch} {
		require.Contains(t, string(doc), "| `"+v+"` |", "the answers table lacks %s", v)
	}
	for _, err := range []error{webhook.ErrMissingOrderSignature, webhook.ErrBadOrderSignature} {
		require.Contains(t, string(doc), "`"+webhook.Reason(err)+"`")
	}
	for _, h := range []string{wire.HeaderPartition, wire.HeaderLeaseEpoch, wire.HeaderOrder, wire.HeaderStreamVersion, wire.HeaderSubject,
		wire.HeaderPreviousVersion, wire.HeaderOrderSignature, wire.HeaderOrderLast} {
		require.Contains(t, string(doc), "`"+h+"`")
	}
}

// TestOrderGateImplicitStatus: a handler that writes no status (an
// implicit 200), only a body, or flushes first, is recorded before the
// answer goes out, like one that writes 2xx.
func TestOrderGateImplicitStatus(t *testing.T) {
	t.Parallel()
	store := webhook.NewMemoryOrderStore()
	var mu sync.Mutex
	var recordedFirst []bool
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get(wire.HeaderStreamVersion)
		switch v {
		case "1":
			_, _ = io.WriteString(w, "ok")
		case "2":
			_ = http.NewResponseController(w).Flush()
		}
		pos, err := store.Position(r.Context(), webhook.OrderKey{Source: "/shop", Stream: "s"})
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		if v != "0" { // v0 writes nothing: its implicit 200 is recorded after it returns
			recordedFirst = append(recordedFirst, strconv.FormatInt(pos.Version, 10) == v)
		}
	})
	srv := httptest.NewServer(webhook.NewOrderGate(store, quietGate).Middleware(next))
	t.Cleanup(srv.Close)
	for v := range 3 {
		status, _, _ := do(t, srv, binary("s", strconv.Itoa(v), "0", "1"), "")
		require.Equal(t, http.StatusOK, status)
		pos, err := store.Position(context.Background(), webhook.OrderKey{Source: "/shop", Stream: "s"})
		require.NoError(t, err)
		require.Equal(t, int64(v), pos.Version)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []bool{true, true}, recordedFirst, "a body or a flush records before it goes out")
}

// TestOrderGateBodyLimit: Middleware reads a structured body up to its
// limit, and hands the handler the same bytes.
func TestOrderGateBodyLimit(t *testing.T) {
	t.Parallel()
	var got string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate, webhook.WithGateMaxBodyBytes(64)).Middleware(next))
	t.Cleanup(srv.Close)
	h := http.Header{}
	h.Set(wire.HeaderContentType, event.ContentTypeCloudEventsJSON)
	h.Set(wire.HeaderPartition, "0")
	h.Set(wire.HeaderLeaseEpoch, "1")
	small := `{"source":"/s","subject":"s","streamversion":0}`
	status, _, _ := do(t, srv, h, small)
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, small, got)
	status, _, body := do(t, srv, h, `{"source":"/s","subject":"s","streamversion":1,"data":"`+strings.Repeat("x", 64)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "body-too-large", body)
}

// TestOrderGateInHandlerRefusesAlteredOrdering: under Handler the gate
// checks the order signature with the Handler's verifier, under both
// schemes: in binary mode, where the stream and version travel in headers
// the body's signature does not cover, an altered stream, version,
// previous version, partition or epoch is refused 401 and never processed.
func TestOrderGateInHandlerRefusesAlteredOrdering(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		scheme webhook.Scheme
		secret string
	}{{webhook.SchemeStandard, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, {webhook.SchemeHMACSHA256, "raw-secret"}} {
		t.Run(string(c.scheme), func(t *testing.T) {
			t.Parallel()
			v, err := webhook.NewVerifier(c.scheme, []string{c.secret})
			require.NoError(t, err)
			signer, err := webhook.NewSigner(c.scheme, c.secret)
			require.NoError(t, err)
			var calls atomic.Int64
			srv := httptest.NewServer(webhook.Handler(v, webhook.NewMemoryStore(0), time.Hour,
				func(context.Context, *http.Request, []byte) error { calls.Add(1); return nil },
				webhook.WithLogger(slog.New(slog.DiscardHandler)), webhook.WithOrderGate(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate))))
			t.Cleanup(srv.Close)
			post := func(version int64, edit func(http.Header)) (int, string) {
				id := "e" + strconv.FormatInt(version, 10)
				h := binary("order-1", strconv.FormatInt(version, 10), "", "")
				h.Set(wire.HeaderIdempotencyKey, id)
				now := time.Now()
				signer.Sign(h, id, now, []byte(`{}`))
				signer.SignOrder(h, id, now, webhook.OrderFields{Stream: "order-1", Version: version, Previous: version - 1, Partition: 2, Epoch: 9})
				if edit != nil {
					edit(h)
				}
				status, _, body := do(t, srv, h, `{}`)
				return status, body
			}
			status, body := post(0, nil)
			require.Equal(t, http.StatusNoContent, status, body)
			for name, edit := range map[string]func(http.Header){
				"stream":    func(h http.Header) { h.Set(wire.HeaderSubject, "order-2") },
				"version":   func(h http.Header) { h.Set(wire.HeaderStreamVersion, "3") },
				"previous":  func(h http.Header) { h.Set(wire.HeaderPreviousVersion, "none") },
				"partition": func(h http.Header) { h.Set(wire.HeaderPartition, "3") },
				"epoch":     func(h http.Header) { h.Set(wire.HeaderLeaseEpoch, "10") },
				"unsigned":  func(h http.Header) { h.Del(wire.HeaderOrderSignature) },
			} {
				status, body := post(1, edit)
				require.Equal(t, http.StatusUnauthorized, status, name)
				want := "bad-order-signature"
				if name == "unsigned" {
					want = "missing-order-signature"
				}
				require.Equal(t, want, body, name)
			}
			require.Equal(t, int64(1), calls.Load(), "nothing altered reached the handler")
			status, body = post(1, nil)
			require.Equal(t, http.StatusNoContent, status, body)
			require.Equal(t, int64(2), calls.Load())
		})
	}
}
