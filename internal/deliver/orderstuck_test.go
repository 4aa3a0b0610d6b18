package deliver_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// A head the receiver's order gate refuses (gap) for longer than
// OrderStuckAfter is dead-lettered and its stream parked, even under
// on_dead_letter skip: the order-stuck state, in the park bucket, in
// `consumer status` and in jsbridge_consumer_streams_order_stuck. Its
// later events are held, the other streams go on, and `consumer dlq
// replay` once the receiver can take the head delivers it and the held
// events in order.
func TestOrderStuckHeadIsParkedAndReplayedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out OrderStuckAfter (a second) and a replay")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck = "order-stuck"
	var resolved atomic.Bool
	rc := newOrderedReceiver(t, b, func(e orderedEvent, _ int) int {
		if e.stream == stuck && e.version == 2 && !resolved.Load() {
			return http.StatusConflict
		}
		return http.StatusNoContent
	})
	inner := rc.Config.Handler
	rc.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := b.event(r.Header.Get(wire.HeaderIdempotencyKey)); e.stream == stuck && e.version == 2 && !resolved.Load() {
			w.Header().Set(wire.HeaderOrder, wire.OrderGap)
			w.Header().Set("Retry-After", "0")
		}
		inner.ServeHTTP(w, r)
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	reg := prometheus.NewRegistry()
	s := orderedSub("stuck", rc.URL)
	s.OnDeadLetter = subscription.DeadLetterSkip // order-stuck parks all the same
	c := b.runOrdered(t, deliver.Config{DeadLetters: q, OrderStuckAfter: time.Second, Registerer: reg}, s)
	b.publishStream(t, stuck, 0, 6)
	b.publishStream(t, "order-free", 0, 6)

	var parked []deadletter.ParkedStream
	require.Eventually(t, func() bool {
		var err error
		parked, err = deadletter.ListParked(b.ctx, b.js, "stuck")
		return err == nil && len(parked) == 1 && parked[0].Held == 3
	}, 20*time.Second, 20*time.Millisecond, "the stuck stream parked, versions 3-5 held")
	require.Equal(t, stuck, parked[0].Stream)
	require.True(t, parked[0].OrderStuck)
	require.Contains(t, parked[0].Reason, "order-stuck")
	require.Contains(t, parked[0].Reason, wire.OrderGap)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 6 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []int64{0, 1}, rc.accepted()[stuck], "nothing after the refused head")

	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	var listed []string
	for _, ss := range st.Subscriptions {
		for _, p := range ss.Partitions {
			listed = append(listed, p.OrderStuck...)
		}
	}
	require.Len(t, listed, 1, "consumer status lists the order-stuck stream")
	require.True(t, strings.HasPrefix(listed[0], stuck+": order-stuck"), listed[0])
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "jsbridge_consumer_streams_order_stuck") == 1 }, 10*time.Second, 20*time.Millisecond)

	letters, err := q.List(b.ctx, "stuck")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "order-stuck")
	resolved.Store(true)
	res := c.Replay(b.ctx, q, letters)
	require.NoError(t, res[0].Err)
	require.True(t, res[0].Delivered)
	require.Eventually(t, func() bool { return len(rc.accepted()[stuck]) == 6 }, 20*time.Second, 10*time.Millisecond)
	requireInOrder(t, rc.accepted(), []string{stuck, "order-free"}, 6)
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "jsbridge_consumer_streams_order_stuck") == 0 }, 10*time.Second, 20*time.Millisecond)
}

// gaugeValue sums the gauge name's series in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func TestOrderStuckAfterNegativeIsRefused(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	_, err := deliver.New(b.js, deliver.Config{OrderStuckAfter: -time.Second}, orderedSub("neg", "http://127.0.0.1:1"))
	require.ErrorContains(t, err, "Config.OrderStuckAfter -1s")
}
