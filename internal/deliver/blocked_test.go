package deliver_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/wire"
)

// A stream whose head the receiver's order gate refuses for ever (gap),
// with far more events behind it than the subscription's hand limit
// (8 × MaxInFlight): its partition's other streams go on being delivered.
// Its later events used to pile up in its lane until the hand limit was
// full, and then every partition of the subscription on the replica
// stopped pulling. Once the head is accepted, the stream's events that
// went back to JetStream are delivered after it, in order.
func TestBlockedStreamDoesNotStopItsPartitionsOtherStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an ordered consumer for seconds")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck = "order-stuck"
	var resolved atomic.Bool // the receiver's gap resolved (its operator acted)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, _ int) int {
		if e.stream == stuck && !resolved.Load() {
			return http.StatusConflict
		}
		return http.StatusNoContent
	})
	// The gate's answer: 409 Jsbridge-Order: gap, Retry-After 1.
	inner := rc.Config.Handler
	rc.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.event(r.Header.Get(wire.HeaderIdempotencyKey)).stream == stuck && !resolved.Load() {
			w.Header().Set(wire.HeaderOrder, wire.OrderGap)
			w.Header().Set("Retry-After", "1")
		}
		inner.ServeHTTP(w, r)
	})
	s := orderedSub("blocked", rc.URL)
	s.MaxInFlight = 2 // a hand limit of 16 events
	b.runOrdered(t, deliver.Config{Partitions: 1, LeaseTTL: 2 * time.Second}, s)

	const behind = 60 // events of the stuck stream: more than the hand limit
	b.publishStream(t, stuck, 0, behind)
	require.Eventually(t, func() bool {
		for _, d := range rc.deliveries() {
			if d.e.stream == stuck {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "the stuck stream's head is tried")
	free := []string{"order-a", "order-b", "order-c", "order-d"}
	for round := int64(0); round < 10; round++ {
		for _, f := range free {
			b.publishStream(t, f, round, round+1)
		}
	}
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		for _, f := range free {
			if len(acc[f]) < 10 {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the free streams are delivered while the stuck one waits")
	requireInOrder(t, rc.accepted(), free, 10)
	tried := map[int64]bool{}
	for _, d := range rc.deliveries() {
		if d.e.stream == stuck {
			tried[d.e.version] = true
		}
	}
	require.Equal(t, map[int64]bool{0: true}, tried, "only the stuck stream's head was sent")

	// Once the receiver accepts the head, the events that went back to
	// JetStream come back and go out after it, in order, none lost.
	resolved.Store(true)
	require.Eventually(t, func() bool { return len(rc.accepted()[stuck]) >= behind }, 60*time.Second, 10*time.Millisecond,
		"the stuck stream's events are delivered once its head is")
	requireInOrder(t, rc.accepted(), []string{stuck}, behind)
}
