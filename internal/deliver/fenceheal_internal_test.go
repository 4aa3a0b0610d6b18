package deliver

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

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
	pt.parking = &parking{o: &ordering{parks: parks}, sub: subscription.Subscription{Name: "orders"}, parked: map[string]*parkedStream{}}
	var fence fenceBuffer
	fence.add(redelivered)
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
