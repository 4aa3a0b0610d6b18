package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
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
		req.Header.Set(wire.HeaderIdempotencyKey, key)
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
	req.Header.Set(wire.HeaderIdempotencyKey, "42")
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

func TestHandlerRejectsFutureTimestamp(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	status, body := b.post(t, "42", []byte(`{"id":"42"}`), func(r *http.Request) {
		b.signer.Sign(r.Header, "42", time.Now().Add(webhook.DefaultTolerance+time.Minute), []byte(`{"id":"42"}`))
	})
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "future", body)
	require.Empty(t, b.nextCalls())
}

// TestHandlerKeyMustMatchWebhookID: under Standard Webhooks a captured
// request replayed with a fresh Idempotency-Key is refused, since only
// webhook-id is signed.
func TestHandlerKeyMustMatchWebhookID(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	body := []byte(`{"id":"42"}`)
	status, _ := b.post(t, "42", body, nil)
	require.Equal(t, http.StatusNoContent, status)
	status, reason := b.post(t, "42", body, func(r *http.Request) {
		r.Header.Set(wire.HeaderIdempotencyKey, "replayed-under-a-new-key")
	})
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "idempotency-key-mismatch", reason)
	require.Len(t, b.nextCalls(), 1, "the replay did not run next")
}

// TestHandlerUnreadableBody: a body that breaks off (malformed chunked
// encoding) answers 422, which the sender does not retry.
func TestHandlerUnreadableBody(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: 42\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\nzz\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Equal(t, "unreadable-body", string(bytes.TrimSpace(got)))
	require.Empty(t, b.nextCalls())
}

// blockNext returns a next behaviour that signals when it starts and then
// waits for release, returning its result.
func blockNext(started chan<- struct{}, release <-chan error) func() error {
	return func() error {
		started <- struct{}{}
		return <-release
	}
}

// postAsync sends b.post in a goroutine; the result arrives on the channel.
func (b *handlerBundle) postAsync(t *testing.T, key string, body []byte) <-chan [2]any {
	out := make(chan [2]any, 1)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(wire.HeaderIdempotencyKey, key)
	b.signer.Sign(req.Header, key, time.Now(), body)
	go func() {
		resp, err := b.srv.Client().Do(req)
		if err != nil {
			out <- [2]any{0, err}
			return
		}
		resp.Body.Close()
		out <- [2]any{resp.StatusCode, nil}
	}()
	return out
}

func waitStatus(t *testing.T, ch <-chan [2]any) int {
	t.Helper()
	select {
	case r := <-ch:
		require.Nil(t, r[1])
		return r[0].(int)
	case <-time.After(30 * time.Second):
		t.Fatal("no response within 30 s")
		return 0
	}
}

// TestHandlerInProgressDuplicate: a retry arriving while the first attempt
// still runs is told to come back (503 + Retry-After), not acknowledged; once
// the first attempt completes, the retry is a duplicate (204) and next ran
// once.
func TestHandlerInProgressDuplicate(t *testing.T) {
	t.Parallel()
	b := setupHandler(t, webhook.WithLease(time.Minute))
	started, release := make(chan struct{}, 1), make(chan error)
	b.failWith(blockNext(started, release))
	body := []byte(`{"id":"42"}`)
	first := b.postAsync(t, "42", body)
	<-started

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(wire.HeaderIdempotencyKey, "42")
	b.signer.Sign(req.Header, "42", time.Now(), body)
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the sender retries 5xx")
	require.Equal(t, "in-progress", string(bytes.TrimSpace(got)))
	wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After is whole seconds")
	require.GreaterOrEqual(t, wait, 1)
	require.LessOrEqual(t, wait, 60, "no longer than the lease")

	release <- nil
	require.Equal(t, http.StatusNoContent, waitStatus(t, first))
	status, _ := b.post(t, "42", body, nil)
	require.Equal(t, http.StatusNoContent, status, "done: the retry is a duplicate")
	require.Len(t, b.nextCalls(), 1)
}

// TestHandlerInProgressThenFailureRetryRuns is the gap a two-state store
// had: the duplicate that arrived while the first attempt ran must not be
// acknowledged, because the first attempt then fails and the retry after it
// has to run next.
func TestHandlerInProgressThenFailureRetryRuns(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	started, release := make(chan struct{}, 1), make(chan error)
	b.failWith(blockNext(started, release))
	body := []byte(`{"id":"42"}`)
	first := b.postAsync(t, "42", body)
	<-started

	status, _ := b.post(t, "42", body, nil)
	require.Equal(t, http.StatusServiceUnavailable, status)
	release <- errors.New("database down")
	require.Equal(t, http.StatusInternalServerError, waitStatus(t, first))

	status, _ = b.post(t, "42", body, nil)
	require.Equal(t, http.StatusNoContent, status, "the released key lets the retry run")
	require.Len(t, b.nextCalls(), 2, "the failed attempt and the retry; the in-progress duplicate did not run next")
}

// TestHandlerLeaseBoundsNext: next's context ends with the lease, so a
// handler honouring it cannot overlap a retry that takes over the key.
func TestHandlerLeaseBoundsNext(t *testing.T) {
	t.Parallel()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{whsecNew})
	require.NoError(t, err)
	signer, err := webhook.NewSigner(webhook.SchemeStandard, whsecNew)
	require.NoError(t, err)
	deadlines := make(chan time.Duration, 1)
	srv := httptest.NewServer(webhook.Handler(v, webhook.NewMemoryStore(10), time.Hour,
		func(ctx context.Context, _ *http.Request, _ []byte) error {
			d, ok := ctx.Deadline()
			if !ok {
				d = time.Now().Add(time.Hour)
			}
			deadlines <- time.Until(d)
			return nil
		}, webhook.WithLease(5*time.Second), webhook.WithLogger(slog.New(slog.DiscardHandler))))
	t.Cleanup(srv.Close)
	body := []byte(`{}`)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(wire.HeaderIdempotencyKey, "42")
	signer.Sign(req.Header, "42", time.Now(), body)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	left := <-deadlines
	require.LessOrEqual(t, left, 5*time.Second)
	require.Greater(t, left, time.Duration(0))
}
