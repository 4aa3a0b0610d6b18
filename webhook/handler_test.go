package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

// handlerBundle is a receiver behind a real HTTP server, and the sender's
// signer for it.
type handlerBundle struct {
	srv    *httptest.Server
	signer *webhook.Signer
	store  *webhook.MemoryStore

	mu    sync.Mutex
	calls []string // bodies next saw, in order
	// fail is what next does on each call (nil entries and calls past the end succeed).
	fail []func() error
}

func setupHandler(t *testing.T, opts ...webhook.HandlerOption) *handlerBundle {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{whsecNew})
	require.NoError(t, err)
	signer, err := webhook.NewSigner(webhook.SchemeStandard, whsecOld, whsecNew)
	require.NoError(t, err)
	b := &handlerBundle{signer: signer, store: webhook.NewMemoryStore(100)}
	next := func(_ context.Context, _ *http.Request, body []byte) error {
		b.mu.Lock()
		n := len(b.calls)
		b.calls = append(b.calls, string(body))
		var f func() error
		if n < len(b.fail) {
			f = b.fail[n]
		}
		b.mu.Unlock()
		if f != nil {
			return f()
		}
		return nil
	}
	opts = append([]webhook.HandlerOption{webhook.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	b.srv = httptest.NewUnstartedServer(webhook.Handler(v, b.store, time.Hour, next, opts...))
	b.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's re-raised panic
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b
}

// failWith sets what next does on its first calls.
func (b *handlerBundle) failWith(fs ...func() error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = fs
}

func (b *handlerBundle) nextCalls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

// post sends a signed webhook with Idempotency-Key key ("" for none) and
// returns the status and body; mutate may change the request before sending.
func (b *handlerBundle) post(t *testing.T, key string, body []byte, mutate func(*http.Request)) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/cloudevents+json")
	if key != "" {
		req.Header.Set(webhook.HeaderIdempotencyKey, key)
	}
	b.signer.Sign(req.Header, key, time.Now(), body)
	if mutate != nil {
		mutate(req)
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(bytes.TrimSpace(got))
}

func TestHandlerDelivers(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	status, _ := b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, []string{`{"id":"42"}`}, b.nextCalls())
}

func TestHandlerDuplicateSkipsNext(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	for range 3 {
		status, _ := b.post(t, "42", []byte(`{"id":"42"}`), nil)
		require.Equal(t, http.StatusNoContent, status)
	}
	require.Len(t, b.nextCalls(), 1, "next runs once per Idempotency-Key")
}

func TestHandlerMissingIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	status, body := b.post(t, "", []byte(`{}`), func(r *http.Request) {
		// Sign with a webhook-id but send no Idempotency-Key.
		b.signer.Sign(r.Header, "42", time.Now(), []byte(`{}`))
	})
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "missing-idempotency-key", body)
	require.Empty(t, b.nextCalls())
}

func TestHandlerRejectsUnverified(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*http.Request)
		reason string
	}{
		"missing signature": {func(r *http.Request) { r.Header.Del("webhook-signature") }, "missing-signature"},
		"missing timestamp": {func(r *http.Request) { r.Header.Del("webhook-timestamp") }, "missing-timestamp"},
		"stale": {func(r *http.Request) {
			r.Header.Set("webhook-timestamp", "1000")
		}, "stale"},
		"tampered body": {func(r *http.Request) {
			r.Body = io.NopCloser(bytes.NewReader([]byte(`{"id":"43"}`)))
			r.ContentLength = 11
		}, "bad-signature"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupHandler(t)
			status, body := b.post(t, "42", []byte(`{"id":"42"}`), tc.mutate)
			require.Equal(t, http.StatusUnauthorized, status)
			require.Equal(t, tc.reason, body)
			require.Empty(t, b.nextCalls())
		})
	}
}

func TestHandlerBodyTooLarge(t *testing.T) {
	t.Parallel()
	b := setupHandler(t, webhook.WithMaxBodyBytes(16))
	status, body := b.post(t, "42", bytes.Repeat([]byte("x"), 17), nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "body-too-large", body)
	status, _ = b.post(t, "43", bytes.Repeat([]byte("x"), 16), nil)
	require.Equal(t, http.StatusNoContent, status, "a body at the limit is accepted")
	require.Len(t, b.nextCalls(), 1)
}

func TestHandlerFailureThenRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.failWith(func() error { return errors.New("database down") })
	status, body := b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, "processing-failed", body)

	status, _ = b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusNoContent, status, "the released key lets the retry run")
	status, _ = b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusNoContent, status)
	require.Len(t, b.nextCalls(), 2, "failed attempt and successful retry; the third is a duplicate")
}

func TestHandlerPanicReleasesKey(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.failWith(func() error { panic("boom") })
	body := []byte(`{"id":"42"}`)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(webhook.HeaderIdempotencyKey, "42")
	b.signer.Sign(req.Header, "42", time.Now(), body)
	resp, err := b.srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err, "net/http aborts the connection of a panicking handler")

	status, _ := b.post(t, "42", body, nil)
	require.Equal(t, http.StatusNoContent, status, "the key was released, the retry runs")
	require.Len(t, b.nextCalls(), 2)
}

func TestHandlerPanicsOnWiringErrors(t *testing.T) {
	t.Parallel()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{whsecNew})
	require.NoError(t, err)
	store := webhook.NewMemoryStore(1)
	next := func(context.Context, *http.Request, []byte) error { return nil }
	require.PanicsWithValue(t, "webhook.Handler: verifier is nil", func() { webhook.Handler(nil, store, time.Hour, next) })
	require.PanicsWithValue(t, "webhook.Handler: idempotency store is nil", func() { webhook.Handler(v, nil, time.Hour, next) })
	require.PanicsWithValue(t, "webhook.Handler: next is nil", func() { webhook.Handler(v, store, time.Hour, nil) })
	require.PanicsWithValue(t, "webhook.Handler: ttl 0s must be > 0", func() { webhook.Handler(v, store, 0, next) })
}

func TestHandlerStatusError(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.failWith(
		func() error {
			return fmt.Errorf("decode: %w", &webhook.StatusError{Status: http.StatusUnprocessableEntity, Err: errors.New("unknown event type")})
		},
		func() error {
			return &webhook.StatusError{Status: http.StatusOK, Err: errors.New("not an error status")}
		},
	)
	status, body := b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "rejected", body)

	status, body = b.post(t, "42", []byte(`{"id":"42"}`), nil)
	require.Equal(t, http.StatusInternalServerError, status, "a non-error status falls back to 500; the rejected key was released")
	require.Equal(t, "processing-failed", body)
	require.Len(t, b.nextCalls(), 2)
}
