package deliver

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// The soak run's stall (issue 31, the partition that waited for ever
// behind the successor check): a stream's later event waited for its
// predecessor, named by JetStream above the ack floor; the predecessor
// then came as a copy of an event already settled and was acked without
// a POST (the delivered record covers it), so it never reached a lane,
// and the stream's entry kept naming it. The floor stayed below it (held
// down by another event), so goesOn never let the stream go on: its
// later events piled up to MaxAckPending. Acked as settled, the copy
// moves its stream on at once, with the clock never moved.
func TestAStreamWhosePredecessorCameAsASettledCopyGoesOn(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	// Versions 3, 4, 5 at sequences 101, 120, 150; the floor is 100.
	pt := testPartition(t, map[string]map[uint64]uint64{key: {101: 120, 120: 150}})
	pt.record = newDeliveredRecord(nil, "k", "me", time.Time{}, pt.clock, slog.New(slog.DiscardHandler))
	pt.succ.fencePassed(100)
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 3, 101)))
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)), "version 4 comes first")
	pt.succ.answered(nextCheck(t, pt))
	require.Equal(t, uint64(120), pt.succ.seen[key].next)

	// Version 4 was settled (before a reset of the consumer): its copy
	// is acked without a POST and handed to no lane.
	require.Empty(t, pt.succ.goesOn([]string{key}, 100), "the floor alone never lets it go")
	pt.record.inherit(map[string]uint64{key: 120})
	require.True(t, pt.ackSettledCopy(newFakeMsg("order-1", 4, 120)))

	require.Equal(t, []string{key}, pt.succ.takeMoved(), "the stream moved on past its settled copy")
	require.Nil(t, pt.succ.nextWaiting(key), "asks what follows the settled copy")
	c := nextCheck(t, pt)
	require.Equal(t, successorCheck{key: key, after: 120, next: 150}, c)
	pt.succ.answered(c)
	m := pt.succ.nextWaiting(key)
	require.NotNil(t, m, "version 5 goes on")
	require.Equal(t, uint64(150), streamSeq(m))
	require.True(t, pt.succ.handOn(key, m))
	require.Empty(t, pt.succ.takeMoved())
}

// A stream's first event since the partition was taken is measured
// against the stream's last event settled here too, not only the floor
// and the delivered record read at the take.
func TestAStreamsFirstEventFollowsItsLastSettledOne(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, nil)
	pt.succ.fencePassed(100)
	pt.book.settled(key, 130)
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 7, 131)), "right after its last settled event")
	require.Empty(t, pt.succ.checking)
}

// stubConsumer is a partition consumer whose Info answers info.
type stubConsumer struct {
	jetstream.Consumer
	info *jetstream.ConsumerInfo
}

func (c stubConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) { return c.info, nil }

// A stream waits for a predecessor above the ack floor that is not
// pending on the consumer: every event pending is in hand (here: the
// stream's waiting event and another stream's event in its lane) and the
// consumer delivered past it. JetStream will never deliver it again, so
// the partition resets its consumer to the ack floor (at once: the counts
// decide, not a timeout), which delivers it again; with a pending
// predecessor, or one not delivered yet, it does not.
func TestAPredecessorNotPendingOnTheConsumerResetsIt(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, map[string]map[uint64]uint64{key: {101: 120}})
	pt.ackWait = 5 * time.Second
	var resets int
	pt.reset = func(context.Context) uint64 { resets++; return 150 }
	pt.succ.fencePassed(100)
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 3, 101)))
	require.True(t, pt.book.enterLane(101))
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)))
	pt.succ.answered(nextCheck(t, pt))
	clock := pt.clock.(*clockwork.FakeClock)
	clock.Advance(unstickAfter + time.Millisecond)

	info := func(pending int, floor, delivered uint64) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{NumAckPending: pending,
			AckFloor: jetstream.SequenceInfo{Stream: floor}, Delivered: jetstream.SequenceInfo{Stream: delivered}}
	}
	// 120 pending besides what is in hand: it comes after AckWait.
	pt.succ.cons = stubConsumer{info: info(3, 100, 150)}
	goOn, still := pt.succ.unstick()
	require.Empty(t, goOn)
	require.NotNil(t, still)
	require.False(t, pt.resetForPredecessors(still))
	// Not delivered yet: it comes in its turn.
	require.False(t, pt.resetForPredecessors(info(2, 100, 110)))
	require.Zero(t, resets)

	// Only what is in hand is pending: 120 never comes.
	pt.succ.cons = stubConsumer{info: info(2, 100, 150)}
	_, still = pt.succ.unstick()
	require.True(t, pt.resetForPredecessors(still))
	require.Equal(t, 1, resets)
	require.False(t, pt.resetForPredecessors(still), "one reset per 3 AckWaits at most")
	clock.Advance(fenceResetAfter * pt.ackWait)
	require.True(t, pt.resetForPredecessors(still))
	require.Equal(t, 2, resets)
}

// The same decision read from a real consumer: the stream order-1's
// version 1 (sequence 3) was acked above the ack floor without its
// stream knowing (the floor held at 0 by order-0's event in its lane),
// and its version 2 (4) waits for it. The consumer's counts say nothing
// pending is out of hand, so the partition resets the consumer to its
// ack floor, and JetStream delivers sequence 3 again.
func TestAPredecessorAckedAboveTheFloorComesAgainAfterTheReset(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "COPY", Subjects: []string{"ordered.>"}})
	require.NoError(t, err)
	cons, err := js.CreateConsumer(ctx, "COPY", jetstream.ConsumerConfig{Durable: "p0", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	require.NoError(t, err)
	for _, st := range []string{"order-0", "order-1", "order-1", "order-1"} {
		_, err := js.Publish(ctx, "ordered.events.0.order."+st+".OrderNoted", []byte(`{}`))
		require.NoError(t, err)
	}
	fetch := func(n int) []jetstream.Msg {
		t.Helper()
		b, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		var out []jetstream.Msg
		for m := range b.Messages() {
			out = append(out, m)
		}
		require.Len(t, out, n)
		return out
	}
	msgs := fetch(4)
	require.NoError(t, msgs[1].DoubleAck(ctx)) // order-1 v0, settled
	require.NoError(t, msgs[2].DoubleAck(ctx)) // order-1 v1: acked, its stream never told

	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, map[string]map[uint64]uint64{key: {2: 3}})
	pt.cons, pt.succ.cons, pt.ackWait = cons, cons, time.Minute
	pt.reset = func(ctx context.Context) uint64 {
		_, err := js.ResetConsumer(ctx, "COPY", "p0")
		require.NoError(t, err)
		return 4
	}
	pt.succ.fencePassed(0)
	require.True(t, pt.book.enterLane(1), "order-0's event in its lane holds the floor")
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 0, 2)))
	pt.book.settled(key, 2)
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 2, 4)))
	pt.succ.answered(nextCheck(t, pt))
	pt.clock.(*clockwork.FakeClock).Advance(unstickAfter + time.Millisecond)

	goOn, still := pt.succ.unstick()
	require.Empty(t, goOn, "the floor (0) is below sequence 3")
	require.NotNil(t, still)
	require.Equal(t, 2, still.NumAckPending, "sequences 1 and 4: both in hand")
	require.True(t, pt.resetForPredecessors(still))

	again := fetch(3)
	var seqs []uint64
	for _, m := range again {
		seqs = append(seqs, streamSeq(m))
	}
	require.Equal(t, []uint64{1, 2, 3}, seqs, "everything above the floor comes again, sequence 3 with it")
}
