package shared_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
)

// One endpoint down beside a healthy one on the same partitions: the
// healthy subscription's deliveries go on, the failing one's breaker
// opens and it gets a breaker cursor (nothing held back, its events not
// retried while open), and once the endpoint is back it receives every
// event once, each stream in order.
func TestAnOpenBreakerGivesABreakerCursorAndTheEndpointCatchesUpAfter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica, and delivers 1,000 events")
	}
	w := newWorld(t)
	var down atomic.Bool
	var refused atomic.Int64
	down.Store(true)
	failing := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if down.Load() {
			refused.Add(1)
			http.Error(rw, "down", http.StatusServiceUnavailable)
			return
		}
		w.rc.serve(rw, r)
	}))
	t.Cleanup(failing.Close)
	require.Equal(t, "ordered", w.subs[0].Name)
	w.subs[0].URL = failing.URL + "/ordered" // an endpoint of its own: a breaker of its own
	w.subs[0].MaxDeliver = 1000              // its probes must not dead-letter anything
	w.subs[0].BackOff = []time.Duration{50 * time.Millisecond}
	reg := prometheus.NewRegistry()
	w.opts = func(cfg *shared.Config, deps *shared.Deps) {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 3, OpenTimeout: 500 * time.Millisecond}, cfg.Logger, nil)
		require.NoError(t, err)
		deps.Breakers, deps.Registerer = set, reg
	}
	r := w.replica(t, "replica-a")
	w.publish(t, 500)
	require.Eventually(t, func() bool { return w.rc.received("/unordered") == 500 }, 90*time.Second, 20*time.Millisecond,
		"the healthy subscription's deliveries go on")
	require.Eventually(t, func() bool {
		n := 0
		for _, ps := range r.Status() {
			if ps.Behind["ordered"] == fanout.StateBreaker {
				n++
			}
		}
		return n == 16
	}, 30*time.Second, 5*time.Millisecond, "the failing one has a breaker cursor on every partition: %+v", r.Status())
	require.Zero(t, w.rc.received("/ordered"))
	w.publish(t, 500)
	require.Eventually(t, func() bool { return w.rc.received("/unordered") == 1000 }, 90*time.Second, 20*time.Millisecond,
		"the healthy one's deliveries go on while the other's breaker is open")
	t.Logf("POSTs the down endpoint refused while 1,000 events were stored: %d", refused.Load())

	down.Store(false)
	w.delivered(t, r)
	// One replica, no hand-over: only a partition lost on a slow
	// machine (its lease not renewed in time) sends an event again.
	if n := released(t, reg); n == 0 {
		require.Zero(t, w.rc.duplicates("/ordered"), "the endpoint back got each event once")
	} else {
		t.Logf("%v partitions lost on a slow machine: ordered got %d events twice", n, w.rc.duplicates("/ordered"))
	}
	require.Eventually(t, func() bool {
		for _, ps := range r.Status() {
			if len(ps.Behind) > 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every cursor rejoined: %+v", r.Status())
}
