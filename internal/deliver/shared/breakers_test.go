package shared_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
	"github.com/jsbridge/jsbridge/wire"
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
	if n := promregtest.Value(t, reg, "jsbridge_consumer_shared_handovers_total", "direction", "released"); n == 0 {
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

// The endpoints' breakers are shared by the replicas through the health
// bucket: a breaker replica a's failures opened is open on replica b,
// started after, before b sends anything; and the endpoint down then
// gets about one probe per open timeout from the two, not one each.
func TestABreakerOpenedByOneReplicaIsOpenOnTheOtherAndProbedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas, and counts probes over several open timeouts")
	}
	w := newWorld(t)
	var mu sync.Mutex
	var posts []time.Time
	byReplica := map[string]int{}
	down := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts = append(posts, time.Now())
		byReplica[r.Header.Get(wire.HeaderReplica)]++
		mu.Unlock()
		http.Error(rw, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(down.Close)
	sub := w.subs[1] // unordered: every partition's events are attempted at once
	sub.URL, sub.MaxDeliver, sub.BackOff = down.URL+"/hook", -1, []time.Duration{50 * time.Millisecond}
	w.subs = []subscription.Subscription{sub}
	const openTimeout = time.Second
	sets := map[string]*breaker.Set{}
	w.opts = func(cfg *shared.Config, deps *shared.Deps) {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: openTimeout}, cfg.Logger, nil)
		require.NoError(t, err)
		sets[cfg.Replica], deps.Breakers = set, set
	}
	w.replica(t, "replica-a")
	w.publish(t, 50)
	require.Eventually(t, func() bool { return sets["replica-a"].Breaker(sub.URL).State() != breaker.Closed },
		30*time.Second, 5*time.Millisecond, "a's failures open its breaker")

	w.replica(t, "replica-b")
	require.Eventually(t, func() bool { return sets["replica-b"].Breaker(sub.URL).State() != breaker.Closed },
		30*time.Second, 5*time.Millisecond, "the breaker a opened is open on b")
	mu.Lock()
	fromB := byReplica["replica-b"]
	mu.Unlock()
	require.Zero(t, fromB, "b found the breaker open: it sent nothing to open it")

	// POSTs admitted before the breaker opened may still be on their
	// way: count from a moment the endpoint was quiet for half an open
	// timeout, when only probes come.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(posts[len(posts)-1]) > openTimeout/2
	}, 30*time.Second, 10*time.Millisecond, "the POSTs in flight when the breaker opened have arrived")
	mu.Lock()
	from := len(posts)
	mu.Unlock()
	sent := func() int { mu.Lock(); defer mu.Unlock(); return len(posts) - from }
	require.Never(t, func() bool { return sent() > 7 }, 5*openTimeout, 10*time.Millisecond,
		"about one probe per open timeout, not one per replica (two replicas: 10)")
	t.Logf("%d POSTs in 5 open timeouts with 2 replicas; by replica %v", sent(), byReplica)
	require.GreaterOrEqual(t, sent(), 2, "probes go on")
}
