package consumer_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/wire"
)

// Under the shared engine, the attempts record keeps the failed attempts
// and the success ending them (Config.Attempts, failures by default),
// and TraceEvent reads where each subscription stands from the
// positions bucket: an event retried once shows its two attempts per
// subscription and is settled; one answered 2xx at once has no record
// and is settled too.
func TestSharedEngineAttemptsRecordedAndTraced(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a shared engine and waits for a retry and a position commit")
	}
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	var mu sync.Mutex
	refused := map[string]bool{} // path → event 3 refused once
	got := map[string]map[string]bool{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		mu.Lock()
		defer mu.Unlock()
		if id == "3" && !refused[r.URL.Path] {
			refused[r.URL.Path] = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if got[r.URL.Path] == nil {
			got[r.URL.Path] = map[string]bool{}
		}
		got[r.URL.Path][id] = true
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	c, err := consumer.New(b.js, consumer.Config{Partitions: 2, LeaseTTL: 2 * time.Second,
		Registerer: prometheus.NewRegistry(), ReplicaID: "replica-a", Attempts: &consumer.AttemptsConfig{},
		Subscriptions: []consumer.Subscription{sharedSub("ordered", rc.URL, consumer.OrderingStream), sharedSub("unordered", rc.URL, consumer.OrderingNone)}})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(b.ctx) })
	b.publishN(t, 0, 6, 2) // event 3 is version 1 of order-0, at sequence 3

	settled := func(tr consumer.EventTrace) bool {
		n := 0
		for _, d := range tr.Deliveries {
			if d.State == consumer.DeliverySettled {
				n++
			}
		}
		return n == 2
	}
	var tr consumer.EventTrace
	require.Eventually(t, func() bool {
		tr, err = consumer.TraceEvent(b.ctx, b.js, "3", consumer.TraceConfig{})
		require.NoError(t, err)
		return len(tr.Attempts) == 4 && settled(tr)
	}, 30*time.Second, 20*time.Millisecond, "event 3's attempts recorded and settled for both subscriptions: %+v", tr)
	require.NotNil(t, tr.Message)
	require.Equal(t, uint64(3), tr.Message.Sequence)
	for i, a := range tr.Attempts {
		sub := []string{"ordered", "unordered"}[i/2]
		require.Equal(t, sub, a.Subscription)
		require.Equal(t, i%2+1, a.Attempt)
		require.Equal(t, []string{"retry", "ack"}[i%2], a.Outcome)
		require.Equal(t, []int{http.StatusServiceUnavailable, http.StatusNoContent}[i%2], a.Status)
		require.Equal(t, "replica-a", a.Replica)
		require.Equal(t, uint64(3), a.StreamSeq)
	}
	for i, d := range tr.Deliveries {
		require.Equal(t, []string{"ordered", "unordered"}[i], d.Subscription)
		require.Equal(t, "pos.p"+strings.TrimPrefix(d.Key, "pos.p"), d.Key, "read from the partition's record")
		require.Equal(t, uint64(3), d.Sequence)
	}

	tr, err = consumer.TraceEvent(b.ctx, b.js, "1", consumer.TraceConfig{SourceStream: "order-0"})
	require.NoError(t, err)
	require.Empty(t, tr.Attempts, "a success on the first attempt is not recorded under failures")
	require.True(t, settled(tr), "event 1 settled for both subscriptions: %+v", tr.Deliveries)
	mu.Lock()
	require.Len(t, got["/ordered"], 6)
	require.Len(t, got["/unordered"], 6)
	mu.Unlock()
}
