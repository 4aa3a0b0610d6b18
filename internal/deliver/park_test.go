package deliver_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
)

func TestOrderedParkThenReplayDeliversHeadAndHeldInOrder(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	var fixed sync.Map
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-park" && e.version == 3 {
			if _, ok := fixed.Load("yes"); !ok {
				return http.StatusUnprocessableEntity
			}
		}
		return http.StatusOK
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	s := orderedSub("park", rc.URL)
	c := b.runOrdered(t, deliver.Config{DeadLetters: q}, s)
	b.publishStream(t, "order-park", 0, 10)
	b.publishStream(t, "order-free", 0, 10)

	var parked []deadletter.ParkedStream
	require.Eventually(t, func() bool {
		var err error
		parked, err = deadletter.ListParked(b.ctx, b.js, "park")
		return err == nil && len(parked) == 1 && parked[0].Held == 6
	}, 20*time.Second, 20*time.Millisecond, "order-park parked with versions 4-9 held")
	require.Equal(t, "order-park", parked[0].Stream)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 10 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []int64{0, 1, 2}, rc.accepted()["order-park"], "nothing after the parked head")

	letters, err := q.List(b.ctx, "park")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	fixed.Store("yes", true)
	res := c.Replay(b.ctx, q, letters)
	require.True(t, res[0].Delivered, "%v", res[0].Err)
	require.NoError(t, res[0].Err)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-park"]) == 10 }, 20*time.Second, 10*time.Millisecond)
	requireInOrder(t, rc.accepted(), []string{"order-park", "order-free"}, 10)
	parked, err = deadletter.ListParked(b.ctx, b.js, "park")
	require.NoError(t, err)
	require.Empty(t, parked)
}

func TestOrderedParkThenSkipReleasesHeldInOrder(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-park" && e.version == 3 {
			return http.StatusUnprocessableEntity
		}
		return http.StatusOK
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	b.runOrdered(t, deliver.Config{DeadLetters: q}, orderedSub("skip", rc.URL))
	b.publishStream(t, "order-park", 0, 10)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "skip")
		return err == nil && len(p) == 1 && p[0].Held == 6
	}, 20*time.Second, 20*time.Millisecond)
	letters, err := q.List(b.ctx, "skip")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.NoError(t, deadletter.SkipParked(b.ctx, b.js, q, letters[0]))
	require.Eventually(t, func() bool { return len(rc.accepted()["order-park"]) == 9 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, []int64{0, 1, 2, 4, 5, 6, 7, 8, 9}, rc.accepted()["order-park"])
	n, err := q.Count(b.ctx, "skip")
	require.NoError(t, err)
	require.Zero(t, n, "the skipped head's dead letter is gone")
}

func TestOrderedParkedStreamHoldsNoOtherStreamAfterAHandOver(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a lease hand-over (about 5 s)")
	}
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-park" && e.version == 1 {
			return http.StatusUnprocessableEntity
		}
		return http.StatusOK
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	s := orderedSub("handpark", rc.URL)
	// One partition: the parked stream's held events keep its consumer's
	// ack floor below every event of order-free the first owner acks.
	cfg := deliver.Config{DeadLetters: q, Partitions: 1, LeaseTTL: time.Second, ReplicaID: "first"}
	first, err := deliver.New(b.js, cfg, s)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()

	b.publishStream(t, "order-park", 0, 5)
	b.publishStream(t, "order-free", 0, 10)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, "handpark")
		return err == nil && len(p) == 1 && p[0].Held == 3
	}, 20*time.Second, 20*time.Millisecond, "order-park parked with versions 2-4 held")
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 10 }, 10*time.Second, 10*time.Millisecond)

	// The first owner goes (a rolling restart); the second takes the
	// partition. order-free's next event is its first in the new owner's
	// hand, and JetStream names version 0, acked above the held floor, as
	// the stream's first after that floor: it never comes back, but the
	// delivered record says order-free was delivered up to version 9.
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
	require.Eventually(t, func() bool { return len(rc.accepted()["order-free"]) == 20 }, 30*time.Second, 20*time.Millisecond,
		"order-free goes on past the parked stream's floor")
	require.Less(t, time.Since(started), s.AckWait, "no wait for order-free's acked events to come back")
	requireInOrder(t, rc.accepted(), []string{"order-free"}, 20)
	require.Equal(t, []int64{0}, rc.accepted()["order-park"], "the parked stream still holds")
}
