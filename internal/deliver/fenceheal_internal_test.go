package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// runClock advances clock by twice the real time passing, every 10 ms,
// until the test ends.
func runClock(t *testing.T, clock *clockwork.FakeClock) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				clock.Advance(20 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { tick.Stop(); close(stop) })
}

// The partition fence that never passed (issue 31): a lease pause let an
// event's AckWait run out while its delivery was in its lane; the copy
// JetStream redelivered landed in the fence; the lane then settled the
// event, but its ack did not land (here: never sent). The event stayed
// pending on the consumer, the fence did not count its settled copy in
// hand, and kept it alive with InProgress, so JetStream never delivered
// it again: "num_ack_pending=749 in_hand=748 in_fence=783" for minutes.
// The fence acks a settled copy it holds: it passes, and nothing stays
// pending.
func TestASettledEventsCopyInTheFenceIsAckedNotKeptAlive(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for an AckWait's redelivery (about 1 s)")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "COPY", Subjects: []string{"ordered.>"}})
	require.NoError(t, err)
	const ackWait = time.Second
	cons, err := js.CreateConsumer(ctx, "COPY", jetstream.ConsumerConfig{Durable: "p0", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	require.NoError(t, err)
	parks, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	subject := "ordered.events.0.order.order-1.OrderNoted"
	_, err = js.Publish(ctx, subject, []byte(`{}`))
	require.NoError(t, err)

	// The lane's delivery (d1), then the copy redelivered after AckWait
	// (d2), which lands in the fence.
	fetchOne := func() jetstream.Msg {
		t.Helper()
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*ackWait))
		require.NoError(t, err)
		for m := range b.Messages() {
			return pull.ParsedOnce(m)
		}
		require.NoError(t, b.Error())
		t.Fatal("nothing delivered")
		return nil
	}
	inLane := fetchOne()
	redelivered := fetchOne()
	require.Equal(t, streamSeq(inLane), streamSeq(redelivered))

	clock := clockwork.NewFakeClock()
	pt := newPartition(partitionDeps{clock: clock, log: slog.New(slog.DiscardHandler)}, 0, cons, 0, clock.Now().Add(time.Hour))
	t.Cleanup(pt.cancel)
	pt.ackWait = ackWait
	pt.parking = park.New(park.Config{Subscription: "orders"}, park.Deps{})
	pt.parking.Provisioned(parks, "events")
	var fence fenceBuffer
	fence.add(redelivered)
	pt.received = consumerSeq(redelivered) // the run loop took it
	// The lane settled it (its record written); its ack never landed.
	pt.book.settled(wire.StreamKey(subject), streamSeq(inLane))
	kctx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	go keepHeldAlive(kctx, clock, ackWait, pt.log, fence.snapshot)
	runClock(t, clock)

	require.Eventually(t, func() bool {
		_, ok := pt.fenceReady(&fence)
		return ok
	}, 6*ackWait, fenceCheck/4, "the fence passes: the settled event's copy is not what it waits for")
	require.Empty(t, fence.take(), "the settled copy left the fence")
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0
	}, 5*time.Second, 10*time.Millisecond, "the settled event is acked: nothing stays pending on the consumer")
}

// A fence that waits for an event nobody brings back (issue 31's rule):
// the owner settled order-1's version 1, its ack never landed, and a
// keep-alive this replica no longer controls (a delivery from before a
// pause, say) sends InProgress for it for ever, so JetStream never
// delivers it again. The subscription is disabled and enabled: the
// partition goes behind its fence, with the event pending and not in
// hand. Within fenceResetAfter AckWaits (on the engine's clock) of the
// shortfall not falling, the owner resets its partition consumer to the
// ack floor, says why in a WARN and counts it; every event, the ones
// written during the wait too, reaches the gated receiver once and in
// order.
func TestAFenceWaitingForAnEventNobodyBringsBackResets(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a fence bound of 3 AckWaits (about 5 s)")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	streams := []string{"order-0", "order-1", "order-2", "order-3"}
	rc := newChainReceiver(t, func(string) time.Duration { return 0 })
	var nextID atomic.Int64
	ids := map[string]string{} // stream/version → event id
	var idsMu sync.Mutex
	publish := func(from, to int64) {
		for v := from; v < to; v++ {
			for _, st := range streams {
				id := nextID.Add(1)
				rc.expect(event.FormatID(id), st, v)
				idsMu.Lock()
				ids[fmt.Sprintf("%s/%d", st, v)] = event.FormatID(id)
				idsMu.Unlock()
				e := event.Event{ID: id, Stream: st, Version: v, Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
				_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
				require.NoError(t, err)
			}
		}
	}
	sub := subscription.Subscription{
		Name: "heal", FilterSubjects: []string{"events.order.>"}, URL: rc.URL, AllowPrivate: true,
		Secrets: []string{chainSecret}, Ordering: subscription.OrderingStream, Start: subscription.Start{Policy: subscription.StartAll},
		AckWait: 2 * time.Second, Timeout: 900 * time.Millisecond, MaxInFlight: 4,
	}
	clock := clockwork.NewFakeClock()
	runClock(t, clock)
	log := &msgLog{}
	var text syncBuffer
	reg := prometheus.NewRegistry()
	var kept atomic.Bool
	c, err := New(js, Config{
		ReplicaID: "only", Clock: clock, Logger: slog.New(slog.NewMultiHandler(log, slog.NewTextHandler(&text, nil))), Registerer: reg, Partitions: 1, LeaseTTL: 4 * time.Second,
		sendAck: func(m jetstream.Msg) error {
			idsMu.Lock()
			stray := attempt.EventID(m) == ids["order-1/1"]
			idsMu.Unlock()
			if !stray || !kept.CompareAndSwap(false, true) {
				return m.Ack()
			}
			// Not acked, and kept alive by someone else for ever.
			go func() {
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
						_ = m.InProgress()
					}
				}
			}()
			return nil
		},
	}, sub)
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	publish(0, 3)
	require.Eventually(t, func() bool { return rc.processedAll(streams, 3) }, 20*time.Second, 5*time.Millisecond, "%v", rc.processedVersions())
	require.True(t, kept.Load())
	cons, err := js.Consumer(ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(sub.Name, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 1
	}, 10*time.Second, 10*time.Millisecond, "only the event kept alive stays pending")

	// Behind the fence again, with the kept event pending and not in hand.
	require.NoError(t, health.SetDisabled(ctx, js, sub.Name, "test", time.Now()))
	require.Eventually(t, func() bool { return log.has("subscription disabled: the partition pulls nothing more") }, 10*time.Second, 5*time.Millisecond)
	_, err = health.Enable(ctx, js, sub.Name)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return log.has("subscription enabled: the partition pulls again") }, 10*time.Second, 5*time.Millisecond)
	enabled := clock.Now()
	publish(3, 6)

	require.Eventually(t, func() bool { return rc.processedAll(streams, 6) }, 30*time.Second, 5*time.Millisecond, "%v", rc.processedVersions())
	waited := clock.Since(enabled)
	t.Logf("the fence passed %s (engine clock) after it began; bound %d AckWaits = %s", waited.Round(time.Millisecond), fenceResetAfter, fenceResetAfter*sub.AckWait)
	require.Less(t, waited, (fenceResetAfter+2)*sub.AckWait, "the fence passed within its bound")
	rc.requireChains(t, streams, 6)
	require.True(t, log.has("partition fence reset"), "a WARN says why")
	idsMu.Lock()
	keptID := ids["order-1/1"]
	idsMu.Unlock()
	require.Regexp(t, `events it brought back that were not in hand.*unsettled=\[\] .*first_settled="\d+ `+keptID+`"`, text.String(),
		"the first pass after the reset names the event it had waited for")
	require.Equal(t, 1.0, counterValue(t, reg, "jsbridge_consumer_partition_fence_resets_total"))
	require.Never(t, func() bool { return rc.postCount() > len(streams)*6 }, time.Second, 50*time.Millisecond,
		"nothing settled was POSTed again after the reset")
}

// counterValue is the sum of the counter name's series in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
