package deliver_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/wire"
)

// A disabled ordered subscription stops pulling: its partition consumers
// keep no pull request waiting, and the events stored meanwhile stay in
// JetStream (not delivered to this replica, not in its memory); only the
// heads that met the 410 are in hand. Enabled, every event is delivered,
// each stream in version order, nothing dead-lettered.
func TestDisabledOrderedSubscriptionStopsPulling(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for deliveries on an embedded JetStream")
	}
	t.Parallel()
	b := setupOrdered(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	var gone atomic.Bool
	gone.Store(true)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int {
		if gone.Load() {
			return http.StatusGone
		}
		return http.StatusOK
	})
	s := orderedSub("orders", rc.URL)
	s.MaxInFlight = 4 // a hand limit of 32 events
	s.MaxDeliver = 2
	const partitions = 4
	b.runOrdered(t, deliver.Config{DeadLetters: q, Partitions: partitions}, s)

	// A 410 disables it, with order-0's three events in hand.
	b.publishStream(t, "order-0", 0, 3)
	require.Eventually(t, func() bool {
		recs, err := health.ReadDisabled(b.ctx, b.js)
		require.NoError(t, err)
		return len(recs) == 1
	}, 15*time.Second, 20*time.Millisecond, "disabled by the 410")

	copyName := wire.OrderedStream("EVENTS")
	totals := func() (pending, ackPending, waiting int) {
		for p := range partitions {
			c, err := b.js.Consumer(b.ctx, copyName, wire.PartitionDurable("orders", p))
			require.NoError(t, err)
			info, err := c.Info(b.ctx)
			require.NoError(t, err)
			pending += int(info.NumPending)
			ackPending += info.NumAckPending
			waiting += info.NumWaiting
		}
		return pending, ackPending, waiting
	}
	require.Eventually(t, func() bool { _, _, waiting := totals(); return waiting == 0 }, 10*time.Second, 10*time.Millisecond,
		"no partition keeps a pull request waiting")

	// 200 events of 20 streams, stored while it is disabled: they stay in
	// JetStream.
	var streams []string
	for i := 1; i <= 20; i++ {
		streams = append(streams, fmt.Sprintf("order-%d", i))
		b.publishStream(t, streams[i-1], 0, 10)
	}
	require.Eventually(t, func() bool { pending, _, _ := totals(); return pending >= 200 }, 15*time.Second, 20*time.Millisecond,
		"the events wait in JetStream, not pulled")
	require.Never(t, func() bool {
		pending, ackPending, waiting := totals()
		return pending < 200 || ackPending > 3 || waiting > 0
	}, time.Second, 50*time.Millisecond, "pulled while disabled")
	sent := len(rc.deliveries())
	require.LessOrEqual(t, sent, 3, "one attempt per head at most")

	gone.Store(false)
	was, err := health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.True(t, was)
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		n := 0
		for _, vs := range acc {
			n += len(vs)
		}
		return n >= 203
	}, 30*time.Second, 20*time.Millisecond, "every event delivered after enable")
	requireInOrder(t, rc.accepted(), streams, 10)
	requireInOrder(t, rc.accepted(), []string{"order-0"}, 3)
	n, err := q.Count(b.ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "nothing dead-lettered")
}
