package deliver_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/wire"
)

// Events Nak'd 5 times before any POST (as by hand-overs, or AckWait
// expiries in a reader's buffer) still get MaxDeliver (3) POSTs: one that
// succeeds at its third is delivered, one that always fails is
// dead-lettered after exactly 3; its failed attempts' count is gone once
// it settled.
func TestOrderedNaksWithoutPOSTSpendNoAttempt(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-ok" && attempt >= 3 {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	s := orderedSub("naks", rc.URL)
	s.MaxDeliver = 3
	s.BackOff = []time.Duration{10 * time.Millisecond}
	dl := &deadLetters{}
	// 5 failures in a row would open the breaker, which is not the subject.
	br, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 100}, nil, nil)
	require.NoError(t, err)
	cfg := deliver.Config{Partitions: 4, DeadLetters: dl, Breakers: br}
	c, err := deliver.New(b.js, cfg, s)
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	b.publishStream(t, "order-ok", 0, 1)
	b.publishStream(t, "order-bad", 0, 1)

	require.NotEqual(t, wire.StreamPartition("order-ok", 4), wire.StreamPartition("order-bad", 4), "one event per partition")
	// Nak each event 5 times on its partition consumer before the
	// consumer runs: NumDelivered is 6 at its first POST.
	for _, stream := range []string{"order-ok", "order-bad"} {
		cons, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable("naks", wire.StreamPartition(stream, 4)))
		require.NoError(t, err)
		// The partition consumers pull in their pinned priority group
		// ("owner"); a fetch outside it gets nothing.
		for n, tries := 0, 0; n < 5; tries++ {
			require.Less(t, tries, 50, "%s: %d of 5 Naks", stream, n)
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup("owner"))
			require.NoError(t, err)
			for m := range batch.Messages() {
				require.NoError(t, m.Nak())
				n++
			}
		}
	}

	b.runOrdered(t, cfg, s)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-ok"]) == 1 && len(dl.list()) == 1 }, 20*time.Second, 10*time.Millisecond)
	var ok, bad int
	for _, d := range rc.deliveries() {
		switch d.e.stream {
		case "order-ok":
			ok++
		case "order-bad":
			bad++
		}
	}
	require.Equal(t, 3, ok, "order-ok: POSTs until its 2xx")
	require.Equal(t, 3, bad, "order-bad: MaxDeliver POSTs")
	require.Equal(t, 3, dl.list()[0].Attempt, "dead-lettered at attempt MaxDeliver")

	kv, err := b.js.KeyValue(b.ctx, wire.DefaultParkBucket)
	require.NoError(t, err)
	for _, d := range rc.deliveries() {
		require.Eventually(t, func() bool {
			_, err := kv.Get(b.ctx, wire.AttemptsKey("naks", d.id))
			return err != nil
		}, 5*time.Second, 10*time.Millisecond, "failed attempts' count of %s deleted once settled", d.id)
	}
}

// A failing event's attempts add up across owners: the first owner makes
// attempt 1 and stops (its retry waits an hour); the next goes on from
// attempt 2 and dead-letters it at attempt 3, MaxDeliver: 3 POSTs in all.
func TestOrderedFailedAttemptsCountAcrossOwners(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusServiceUnavailable })
	s := orderedSub("owners", rc.URL)
	s.MaxDeliver = 3
	s.BackOff = []time.Duration{time.Hour, 10 * time.Millisecond}
	dl := &deadLetters{}
	cfg := deliver.Config{Partitions: 4, LeaseTTL: time.Second, DeadLetters: dl}
	first, err := deliver.New(b.js, cfg, s)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	b.publishStream(t, "order-1", 0, 1)
	require.Eventually(t, func() bool { return len(rc.deliveries()) == 1 }, 20*time.Second, 10*time.Millisecond, "attempt 1")
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultParkBucket)
	require.NoError(t, err)
	id := rc.deliveries()[0].id
	require.Eventually(t, func() bool {
		e, err := kv.Get(b.ctx, wire.AttemptsKey("owners", id))
		return err == nil && string(e.Value()) == "1"
	}, 5*time.Second, 10*time.Millisecond, "attempt 1 recorded as failed")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}

	b.runOrdered(t, cfg, s)
	require.Eventually(t, func() bool { return len(dl.list()) == 1 }, 20*time.Second, 10*time.Millisecond, "dead-lettered")
	require.Len(t, rc.deliveries(), 3, "MaxDeliver POSTs across both owners")
	require.Equal(t, 3, dl.list()[0].Attempt)
}
