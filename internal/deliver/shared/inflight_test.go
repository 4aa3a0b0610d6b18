package shared_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// A subscription's MaxInFlight bounds its POSTs running at once on the
// replica, over every partition it owns (subscription.Subscription:
// "per consumer process"), not on each partition: 4 of them, for 200
// events over 100 streams on 16 partitions, to a receiver that holds
// each request 20 ms, or until a fifth one arrives.
func TestMaxInFlightBoundsTheReplicasPOSTsOverAllItsPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	const limit = 4
	for _, name := range []string{"ordered", "unordered"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			var (
				mu            sync.Mutex
				running, most int
				got           = map[string]bool{}
			)
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				mu.Lock()
				running++
				most = max(most, running)
				got[r.Header.Get("webhook-id")] = true
				deadline := time.Now().Add(20 * time.Millisecond)
				for running <= limit && time.Now().Before(deadline) {
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
				}
				running--
				mu.Unlock()
				rw.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			for _, s := range w.subs {
				if s.Name == name {
					s.URL, s.MaxInFlight = srv.URL, limit
					w.subs = []subscription.Subscription{s}
					break
				}
			}
			w.replica(t, "replica-a")
			w.publish(t, 200)
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) == w.next
			}, 60*time.Second, 10*time.Millisecond, "every event delivered")
			mu.Lock()
			defer mu.Unlock()
			require.LessOrEqual(t, most, limit, "POSTs running at once on the replica")
		})
	}
}
