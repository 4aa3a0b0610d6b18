package deliver_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
)

// A former owner acked a stream's events out of order, above the
// partition consumer's ack floor (another stream's head, retried in
// place, holds the floor below them), and was replaced (a rolling
// restart). The new owner hands the stream's next event on at once: the
// delivered record says its predecessor was delivered, so it does not
// wait for it to come back (it never would), and nothing waits for a
// timeout.
func TestOrderedHandOverAfterOutOfOrderAcksGoesOnAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two owners one after the other (about 5 s)")
	}
	t.Parallel()
	b := setupOrdered(t)
	var holding atomic.Bool
	holding.Store(true)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-held" && holding.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	s := orderedSub("handheld", rc.URL)
	s.MaxDeliver = 1000 // order-held's head is retried in place all along
	s.BackOff = []time.Duration{100 * time.Millisecond}
	// One partition: order-held's head (sequence 1) keeps the ack floor
	// at 0, below every event of order-free the first owner acks.
	cfg := deliver.Config{Partitions: 1, LeaseTTL: time.Second, ReplicaID: "first", Breakers: lenientBreakers(t)}
	first, err := deliver.New(b.js, cfg, s)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()

	b.publishStream(t, "order-held", 0, 1)
	b.publishStream(t, "order-free", 0, 10)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 10 }, 20*time.Second, 10*time.Millisecond)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the first owner's Run did not return")
	}

	b.publishStream(t, "order-free", 10, 20)
	cfg.ReplicaID = "second"
	started := time.Now()
	b.runOrdered(t, cfg, s)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 20 }, 30*time.Second, 10*time.Millisecond,
		"order-free goes on past the held floor")
	took := time.Since(started)
	t.Logf("the second owner delivered order-free's next 10 events %s after it started", took.Round(time.Millisecond))
	// Its start (provisioning, the claim at its first cycle, the fence)
	// takes a lease TTL or so; waiting for order-free's acked events to
	// come back took six AckWaits, at least a minute.
	require.Less(t, took, s.AckWait, "no stream waits an AckWait after a graceful hand-over")
	requireInOrder(t, rc.accepted(), []string{"order-free"}, 20)

	holding.Store(false)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-held"]) == 1 }, 20*time.Second, 10*time.Millisecond)
}

// lenientBreakers is a breaker set that stays closed through the failures
// a test's receiver answers on purpose.
func lenientBreakers(t *testing.T) *breaker.Set {
	t.Helper()
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1_000_000, MinRequests: 1_000_000}, nil, nil)
	require.NoError(t, err)
	return set
}
