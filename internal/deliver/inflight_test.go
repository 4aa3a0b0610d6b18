package deliver_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
)

// TestOrderedInFlightGaugeCountsPOSTs: jsbridge_consumer_in_flight counts
// an ordered subscription's POSTs while they run (one per stream here: the
// next version waits for its predecessor), and goes back to 0 when they end.
func TestOrderedInFlightGaugeCountsPOSTs(t *testing.T) {
	b := setupOrdered(t)
	release := make(chan struct{})
	var running atomic.Int32
	rc := newOrderedReceiver(t, b, func(e orderedEvent, _ int) int {
		running.Add(1)
		defer running.Add(-1)
		<-release
		return 204
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	reg := prometheus.NewRegistry()
	s := orderedSub("inflight", rc.URL)
	s.Timeout = 20 * time.Second
	s.AckWait = 60 * time.Second
	b.runOrdered(t, deliver.Config{Registerer: reg}, s)
	streams := []string{"order-1", "order-2", "order-3"}
	for _, st := range streams {
		b.publishStream(t, st, 0, 2)
	}
	require.Eventually(t, func() bool { return running.Load() == 3 }, 20*time.Second, 10*time.Millisecond, "one POST per stream held by the receiver")
	require.Equal(t, 3.0, gaugeValue(t, reg, "jsbridge_consumer_in_flight"), "the held POSTs are in flight")
	close(release)
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		return len(acc["order-1"]) == 2 && len(acc["order-2"]) == 2 && len(acc["order-3"]) == 2
	}, 20*time.Second, 10*time.Millisecond)
	requireInOrder(t, rc.accepted(), streams, 2)
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "jsbridge_consumer_in_flight") == 0 }, 10*time.Second, 10*time.Millisecond)
}
