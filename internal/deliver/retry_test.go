package deliver_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
)

func TestRetryAfter503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b.run(t, deliver.Config{}, sub("orders", rc.URL))
	b.publish(t, 11, "order-4", "OrderPlaced", `{"x":1}`)

	got := rc.waitFor(t, 2)
	requireSettled(t, b, "orders", 1)
	require.Equal(t, "11", got[0].header.Get("Idempotency-Key"))
	require.Equal(t, "11", got[1].header.Get("Idempotency-Key"), "same key on every attempt")
	require.Equal(t, got[0].body, got[1].body)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 2, rc.count())
}

func TestRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			w.WriteHeader(http.StatusOK)
			return
		}
		if n == 0 {
			http.Redirect(w, r, "/moved", http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b.run(t, deliver.Config{}, sub("orders", rc.URL+"/hook"))
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)

	got := rc.waitFor(t, 2)
	requireSettled(t, b, "orders", 1)
	require.Equal(t, "/hook", got[0].path)
	require.Equal(t, "/hook", got[1].path, "3xx is retried at the endpoint, the redirect is not followed")
	time.Sleep(100 * time.Millisecond)
	for _, r := range rc.requests() {
		require.NotEqual(t, "/moved", r.path)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	s := sub("orders", rc.URL)
	s.BackOff = []time.Duration{10 * time.Millisecond}
	b.run(t, deliver.Config{}, s)
	b.publish(t, 3, "order-1", "OrderPlaced", `{}`)

	got := rc.waitFor(t, 2)
	requireSettled(t, b, "orders", 1)
	require.GreaterOrEqual(t, got[1].at.Sub(got[0].at), 900*time.Millisecond, "Retry-After: 1 wins over a 10 ms BackOff")
}
