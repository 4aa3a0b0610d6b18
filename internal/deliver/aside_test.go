package deliver_test

import (
	"fmt"
	"math"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// asideSub is an ordered subscription whose one stuck stream, with more
// events behind its head than the replica's hand limit (8 × MaxInFlight
// = 16) and than the partition consumer's MaxAckPending (20), would stop
// every other stream of its partition if those events stayed in hand.
func asideSub(name, url string) subscription.Subscription {
	s := orderedSub(name, url)
	s.MaxInFlight = 2
	s.MaxAckPending = 20
	s.MaxDeliver = -1 // the stuck head is retried until the test lets it go
	return s
}

// asideRecords returns the park bucket's records of streams set aside of
// subscription sub.
func asideRecords(t *testing.T, b *orderedBundle, sub string) []string {
	t.Helper()
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultParkBucket)
	if err != nil {
		return nil // not made yet
	}
	l, err := kv.ListKeysFiltered(b.ctx, wire.AsideFilter(sub))
	if err != nil {
		return nil
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys
}

// freeStreams are the streams delivered beside the stuck one.
func freeStreams(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("order-free%d", i)
	}
	return out
}

// publishRounds publishes versions from..to-1 of every stream, one round
// of versions at a time (the streams' events interleaved in the copy).
func (b *orderedBundle) publishRounds(t *testing.T, streams []string, from, to int64) {
	t.Helper()
	for v := from; v < to; v++ {
		for _, s := range streams {
			b.publish(t, s, v, "OrderNoted")
		}
	}
}

// neverOpen is a breaker set whose breakers never open: a stuck stream's
// refusals must not pause its endpoint's other streams in these tests.
func neverOpen(t *testing.T) *breaker.Set {
	t.Helper()
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
	require.NoError(t, err)
	return set
}

// A stream whose head the receiver's order gate refuses (gap), with
// more events behind it than the hand limit and than MaxAckPending, beside
// ten free streams in the same partition: the free streams are delivered
// in order meanwhile; once the head is accepted, the stuck stream's events
// (those set aside, read again from the copy, and those written while it
// catches up) are each processed once, in order, by a gated receiver, and
// the stream is live again (its record deleted).
func TestStuckStreamIsSetAsideAndItsPartitionGoesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an ordered consumer for seconds")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck = "order-stuck"
	g := newGatedReceiver(t, b)
	// The gate waits for an earlier version of the stuck stream that
	// never comes: 409 Jsbridge-Order: gap, until the test lets it go.
	var resolved atomic.Bool
	inner := g.Config.Handler
	g.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.event(r.Header.Get(wire.HeaderIdempotencyKey)).stream == stuck && !resolved.Load() {
			w.Header().Set(wire.HeaderOrder, wire.OrderGap)
			w.WriteHeader(http.StatusConflict)
			return
		}
		inner.ServeHTTP(w, r)
	})
	s := asideSub("aside", g.URL)
	b.runOrdered(t, deliver.Config{Partitions: 1, LeaseTTL: 2 * time.Second, Breakers: neverOpen(t)}, s)

	const behind = 60 // the stuck stream's events: over the hand limit and MaxAckPending
	b.publishStream(t, stuck, 0, behind)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the stuck stream is set aside")
	free := freeStreams(10)
	b.publishRounds(t, free, 0, 10)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 10)...)
	}
	require.Empty(t, g.versions(stuck), "the stuck stream's head is still refused")
	// consumer status lists it: set aside, its head (version 0) and the
	// gate's answer.
	st, err := inspect.ReadStatus(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, st.Stuck, 1)
	require.Equal(t, inspect.StateSetAside, st.Stuck[0].State)
	require.Equal(t, s.Name, st.Stuck[0].Subscription)
	require.Equal(t, "0", st.Stuck[0].HeadVersion)
	require.Equal(t, stuck, b.event(st.Stuck[0].HeadEventID).stream)
	require.Contains(t, st.Stuck[0].LastAnswer, wire.OrderGap)
	require.False(t, st.Stuck[0].Since.IsZero())

	// Let the head go; events written meanwhile arrive live while the
	// set-aside ones are read again from the copy.
	resolved.Store(true)
	b.publishStream(t, stuck, behind, behind+20)
	g.requireProcessed(t, stuck, versionsFrom(0, behind+20)...)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the stream caught up is live again")
	b.publishStream(t, stuck, behind+20, behind+30)
	g.requireProcessed(t, stuck, versionsFrom(0, behind+30)...)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 10)...)
	}
}

// A partition handed over to another replica while a stream is set aside:
// the new owner learns it from the park bucket, acks the stream's events
// out as they come, and reads them again from the copy once the head goes.
// Nothing is lost, nothing is processed twice or out of order.
func TestStreamSetAsideSurvivesAHandOver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two ordered consumers for seconds")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck = "order-stuck"
	g := newGatedReceiver(t, b)
	g.setFail(func(e orderedEvent) int {
		if e.stream == stuck {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	s := asideSub("handover", g.URL)
	// The refused head stays pending across the hand-over and keeps the
	// partition consumer's ack floor below the free streams' events the
	// first replica acked: the new owner's successor check lets those
	// streams go on at once, their entries in the delivered record
	// (docs/ordering.md, "The delivered record"), whatever is set aside.
	cfg := deliver.Config{Partitions: 1, LeaseTTL: 2 * time.Second, ReplicaID: "first", Breakers: neverOpen(t)}
	_, stopFirst := b.startOrdered(t, cfg, s)

	b.publishStream(t, stuck, 0, 40)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the stuck stream is set aside")
	free := freeStreams(4)
	b.publishRounds(t, free, 0, 5)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 5)...)
	}

	// The first replica stops (its head, still refused, goes back to
	// JetStream); the second takes the partition while the stream is
	// aside, and more of it is written meanwhile.
	stopFirst()
	b.publishStream(t, stuck, 40, 50)
	b.publishRounds(t, free, 5, 10)
	cfg.ReplicaID = "second"
	b.runOrdered(t, cfg, s)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 10)...)
	}
	b.publishStream(t, stuck, 50, 60)
	require.Eventually(t, func() bool {
		// Every event of the stuck stream written so far is acked out
		// or held by the head: nothing waits in hand for it.
		info, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable(s.Name, 0))
		if err != nil {
			return false
		}
		ci, err := info.Info(b.ctx)
		return err == nil && ci.NumAckPending <= 1 && ci.NumPending == 0
	}, 20*time.Second, 10*time.Millisecond, "the stuck stream's events are acked out by the new owner")
	require.Empty(t, g.versions(stuck))

	g.setFail(nil)
	g.requireProcessed(t, stuck, versionsFrom(0, 60)...)
	require.Eventually(t, func() bool { return len(asideRecords(t, b, s.Name)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the stream caught up is live again")
}

// A stream set aside (gap answers) and handed over with the delivered
// record in play. Beside it a stream whose head is refused in place (503,
// too few events behind it to be set aside) keeps the partition
// consumer's ack floor below everything else throughout, so only the
// delivered record tells a new owner what its predecessors settled: the
// free streams' events acked out of order, and the set-aside stream's
// events read again from the copy (acked out undelivered; settled, they
// move the record). The stream is set aside, read again and live again at
// the first owner, whose successor goes on with it at once; set aside
// again at the second, it is handed over while aside, and the third reads
// it again. Every event is processed once, in order, and each step is
// done within 10 s: no stream waits for an AckWait (30 s here), let alone
// the minute of the former six-AckWaits rule.
func TestSetAsideStreamHandedOverWithTheDeliveredRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three ordered consumers for seconds")
	}
	t.Parallel()
	b := setupOrdered(t)
	const stuck, held = "order-stuck", "order-held"
	g := newGatedReceiver(t, b)
	const never = int64(math.MaxInt64)
	var refuseFrom atomic.Int64 // the stuck stream's versions from it on answer gap
	var heldOver atomic.Bool
	inner := g.Config.Handler
	g.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := b.event(r.Header.Get(wire.HeaderIdempotencyKey))
		switch {
		case e.stream == stuck && e.version >= refuseFrom.Load():
			w.Header().Set(wire.HeaderOrder, wire.OrderGap)
			w.WriteHeader(http.StatusConflict)
			return
		case e.stream == held && !heldOver.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	})
	s := asideSub("asiderecord", g.URL)
	s.AckWait = 30 * time.Second
	within := func(what string, f func() bool) {
		t.Helper()
		start := time.Now()
		require.Eventually(t, f, 10*time.Second, 10*time.Millisecond, what)
		t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
	}
	processed := func(stream string, to int64) func() bool {
		return func() bool { return len(g.versions(stream)) >= int(to) }
	}
	aside := func(n int) func() bool { return func() bool { return len(asideRecords(t, b, s.Name)) == n } }
	free := freeStreams(4)
	freeProcessed := func(to int64) func() bool {
		return func() bool {
			for _, f := range free {
				if !processed(f, to)() {
					return false
				}
			}
			return true
		}
	}
	cfg := deliver.Config{Partitions: 1, LeaseTTL: 2 * time.Second, ReplicaID: "first", Breakers: neverOpen(t)}
	_, stopFirst := b.startOrdered(t, cfg, s)

	// The held head comes first in the copy: the floor stays below it.
	b.publishStream(t, held, 0, 2)
	b.publishStream(t, stuck, 0, 40)
	within("the stuck stream is set aside at the first owner", aside(1))
	b.publishRounds(t, free, 0, 5)
	within("free streams delivered by the first owner", freeProcessed(5))
	require.Empty(t, g.versions(stuck))
	refuseFrom.Store(never)
	within("the stuck stream read again at the first owner", processed(stuck, 40))
	within("the stuck stream is live again at the first owner", aside(0))

	// Hand-over: the stuck stream's last event (read again, acked out) and
	// the free streams' are above the floor, at their entries.
	stopFirst()
	b.publishStream(t, stuck, 40, 45)
	b.publishRounds(t, free, 5, 8)
	cfg.ReplicaID = "second"
	_, stopSecond := b.startOrdered(t, cfg, s)
	within("the stream live again goes on at the second owner", processed(stuck, 45))
	within("free streams go on at the second owner", freeProcessed(8))

	// Set aside again, and handed over while aside.
	refuseFrom.Store(45)
	b.publishStream(t, stuck, 45, 85)
	within("the stuck stream is set aside at the second owner", aside(1))
	b.publishRounds(t, free, 8, 10)
	within("free streams delivered by the second owner", freeProcessed(10))
	stopSecond()
	b.publishStream(t, stuck, 85, 90)
	b.publishRounds(t, free, 10, 12)
	cfg.ReplicaID = "third"
	b.runOrdered(t, cfg, s)
	within("free streams go on at the third owner", freeProcessed(12))
	require.Len(t, asideRecords(t, b, s.Name), 1, "still aside at the third owner")
	require.Len(t, g.versions(stuck), 45)
	refuseFrom.Store(never)
	within("the stuck stream read again at the third owner", processed(stuck, 90))

	// The held head goes; the floor passes everything, and the stream
	// loaded from the second owner's record is live again.
	require.Empty(t, g.versions(held), "the held head was refused all along")
	heldOver.Store(true)
	within("the held stream delivered", processed(held, 2))
	within("the stuck stream is live again at the third owner", aside(0))
	g.requireProcessed(t, held, versionsFrom(0, 2)...)
	g.requireProcessed(t, stuck, versionsFrom(0, 90)...)
	for _, f := range free {
		g.requireProcessed(t, f, versionsFrom(0, 12)...)
	}
}
