package deliver_test

import (
	"net/http"
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

// A stream parked at once (its head answered a permanent 422) with more
// later events than the partition consumer's MaxAckPending (20), beside
// ten free streams in the same partition: its held events are set aside
// (acked out, a record in the park bucket) once they press on
// MaxAckPending, so the free streams keep flowing and nothing of the
// parked stream stays pending. After `consumer dlq replay` every event of
// the parked stream, those set aside and those written meanwhile, is
// processed once, in order, by a gated receiver, and the stream is live
// again.
func TestParkedStreamIsSetAsideAndItsPartitionGoesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an ordered consumer for seconds")
	}
	t.Parallel()
	b, g, fixed, q, s := parkedSetup(t, "parkaside")
	const parked = parkedStream
	c := b.runOrdered(t, deliver.Config{Partitions: 1, DeadLetters: q, LeaseTTL: 2 * time.Second, Breakers: neverOpen(t)}, s)

	const behind = 60 // three times MaxAckPending
	b.publishStream(t, parked, 0, behind)
	require.Eventually(t, func() bool {
		p, err := deadletter.ListParked(b.ctx, b.js, s.Name)
		return err == nil && len(p) == 1 && len(asideRecords(t, b, s.Name)) == 1
	}, 20*time.Second, 10*time.Millisecond, "the stream is parked and its later events set aside")
	free := freeStreams(10)
	b.publishRounds(t, free, 0, 10)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 10)...)
	}
	require.Eventually(t, func() bool {
		// Nothing of the parked stream is pending on the partition
		// consumer: every later event was acked out.
		cons, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(s.Name, 0))
		if err != nil {
			return false
		}
		ci, err := cons.Info(b.ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	}, 20*time.Second, 10*time.Millisecond, "the parked stream holds nothing against MaxAckPending")
	require.Empty(t, g.versions(parked))
	// consumer status lists it once, as parked, with its head.
	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, st.Stuck, 1)
	require.Equal(t, inspect.StateParked, st.Stuck[0].State)
	require.Equal(t, "0", st.Stuck[0].HeadVersion)
	require.Contains(t, st.Stuck[0].LastAnswer, "422")

	// Replay the head; events written meanwhile arrive live while those
	// set aside are read again from the copy.
	letters, err := q.List(b.ctx, s.Name)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	fixed.Store(true)
	res := c.Replay(b.ctx, q, letters)
	require.NoError(t, res[0].Err)
	require.True(t, res[0].Delivered)
	b.publishStream(t, parked, behind, behind+20)
	g.requireProcessed(t, parked, versionsFrom(0, behind+20)...)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the stream caught up is live again")
	b.publishStream(t, parked, behind+20, behind+30)
	g.requireProcessed(t, parked, versionsFrom(0, behind+30)...)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 10)...)
	}
}

// A stream whose head is refused 503 for ever (max_deliver -1) is set
// aside, and once aside for longer than OrderStuckAfter it is counted in
// jsbridge_consumer_streams_set_aside_stuck (it is not parked: its head
// is still tried) and listed by consumer status; once the endpoint takes
// the head, the stream is read again, live again and uncounted.
func TestStreamSetAsideTooLongIsCountedStuck(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out OrderStuckAfter (a second)")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck = "order-stuck"
	g := newGatedReceiver(t, b)
	var fixed atomic.Bool
	g.setFail(func(e orderedEvent) int {
		if e.stream == stuck && !fixed.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	reg := prometheus.NewRegistry()
	s := asideSub("asidestuck", g.URL)
	b.runOrdered(t, deliver.Config{Partitions: 1, LeaseTTL: 2 * time.Second, OrderStuckAfter: time.Second, Registerer: reg, Breakers: neverOpen(t)}, s)
	b.publishStream(t, stuck, 0, 30)
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "jsbridge_consumer_streams_set_aside_stuck") == 1 }, 20*time.Second, 20*time.Millisecond,
		"the stream aside past OrderStuckAfter is counted")
	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, st.Stuck, 1)
	require.Equal(t, inspect.StateSetAside, st.Stuck[0].State)
	require.Contains(t, st.Stuck[0].LastAnswer, "503")
	parked, err := deadletter.ListParked(b.ctx, b.js, s.Name)
	require.NoError(t, err)
	require.Empty(t, parked, "a head refused 503 is not parked by the bound")
	b.publishRounds(t, freeStreams(3), 0, 5)
	for _, f := range freeStreams(3) {
		g.requireProcessed(t, f, versionsFrom(0, 5)...)
	}

	fixed.Store(true)
	g.requireProcessed(t, stuck, versionsFrom(0, 30)...)
	require.Eventually(t, func() bool { return gaugeValue(t, reg, "jsbridge_consumer_streams_set_aside_stuck") == 0 }, 20*time.Second, 20*time.Millisecond,
		"live again, uncounted")
}

// A parked stream set aside, handed over while parked: the new owner
// reads the aside record (and the park entry) before its fence passes,
// acks the stream's later events out as they come, and reads them all
// again from the copy once the head is replayed: each processed once,
// in order, by a gated receiver.
func TestParkedStreamSetAsideSurvivesAHandOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two ordered consumers for seconds")
	}
	t.Parallel()
	b, g, fixed, q, s := parkedSetup(t, "parkhandover")
	const parked = parkedStream
	cfg := deliver.Config{Partitions: 1, DeadLetters: q, LeaseTTL: 2 * time.Second, ReplicaID: "first", Breakers: neverOpen(t)}
	_, stopFirst := b.startOrdered(t, cfg, s)
	b.publishStream(t, parked, 0, 40)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the parked stream's events are set aside")

	stopFirst()
	b.publishStream(t, parked, 40, 50)
	cfg.ReplicaID = "second"
	c := b.runOrdered(t, cfg, s)
	b.publishRounds(t, freeStreams(4), 0, 5)
	for _, f := range freeStreams(4) {
		g.requireProcessed(t, f, versionsFrom(0, 5)...)
	}
	require.Eventually(t, func() bool {
		cons, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(s.Name, 0))
		if err != nil {
			return false
		}
		ci, err := cons.Info(b.ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	}, 20*time.Second, 10*time.Millisecond, "the new owner acks the parked stream's events out")
	require.Empty(t, g.versions(parked))

	letters, err := q.List(b.ctx, s.Name)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	fixed.Store(true)
	res := c.Replay(b.ctx, q, letters)
	require.NoError(t, res[0].Err)
	g.requireProcessed(t, parked, versionsFrom(0, 50)...)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the stream caught up is live again")
	b.publishStream(t, parked, 50, 55)
	g.requireProcessed(t, parked, versionsFrom(0, 55)...)
}

// parkedStream is the stream parkedSetup's receiver refuses.
const parkedStream = "order-parked"

// parkedSetup is an ordered consumer's bus, a gated receiver answering
// 422 to parkedStream's version 0 until fixed is set, a provisioned
// dead-letter stream and subscription name set to park on a dead letter.
func parkedSetup(t *testing.T, name string) (*orderedBundle, *gatedReceiver, *atomic.Bool, *deadletter.DLQ, subscription.Subscription) {
	t.Helper()
	b := setupOrdered(t)
	g := newGatedReceiver(t, b)
	fixed := new(atomic.Bool)
	g.setFail(func(e orderedEvent) int {
		if e.stream == parkedStream && e.version == 0 && !fixed.Load() {
			return http.StatusUnprocessableEntity
		}
		return 0
	})
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	s := asideSub(name, g.URL)
	s.OnDeadLetter = subscription.DeadLetterPark
	return b, g, fixed, q, s
}
