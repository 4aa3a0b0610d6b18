package deliver

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/wire"
)

// What a partition does with an event of a stream set aside, and when a
// stream whose re-read caught up goes live again, without JetStream.
func TestAsidesTakeAndCatchUp(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	as := newAsides(nil, "sub", 0, "r1", clock, slog.New(slog.DiscardHandler), nil, nil)
	mayAck := func() error { return nil }
	const key = "ordered.events.0.order.order-1"
	m := func(seq uint64) *ackMsg { return newAckMsg(seq) }

	require.False(t, as.takes(key, m(5), mayAck), "no stream aside: nothing taken")

	// A head refused: a candidate once refused for asideWait, or at once
	// when the limits press.
	as.refusedHead(key, m(4), "HTTP 503")
	require.Empty(t, as.candidates(false))
	require.Equal(t, refusedHead{subject: m(4).Subject(), seq: 4, since: clock.Now(), eventID: attempt.EventID(m(4)), version: m(4).Headers().Get(wire.HeaderStreamVersion), answer: "HTTP 503"}, as.candidates(true)[key])
	clock.Advance(asideWait)
	require.Len(t, as.candidates(false), 1)

	as.streams[key] = &asideStream{rec: asideRecord{Start: 10, From: 10, Subject: m(4).Subject()}, out: map[uint64]bool{}, whole: true}
	require.Empty(t, as.candidates(true), "a stream aside is no candidate")
	before := m(9)
	require.False(t, as.takes(key, before, mayAck), "an event before the start (the head) is delivered as usual")
	after := m(12)
	require.True(t, as.takes(key, after, mayAck), "an event from the start on is acked out")
	require.Eventually(t, func() bool { return after.acks.Load() == 1 }, 10*time.Second, time.Millisecond, "acked out")
	require.Zero(t, before.acks.Load())

	// The re-read starts when the partition says it may (mayReread).
	notYet := func(string, asideRecord, bool) bool { return false }
	ready := func(_ string, rec asideRecord, whole bool) bool { return whole && rec.From == 10 }
	require.Empty(t, as.toRead(notYet))
	require.Equal(t, map[string]uint64{key: 10}, as.toRead(ready))
	require.Empty(t, as.toRead(ready), "one re-read at a time")

	// Caught up at 12 with 12 acked out: read on; at 13: live, once 12's
	// ack-out is confirmed and the events read again were acked out too.
	as.readEnded(key, true, 12)
	require.Empty(t, as.caughtUp(), "an event acked out at or after where it caught up: read again")
	require.Equal(t, map[string]uint64{key: 10}, as.toRead(ready))
	as.mu.Lock()
	as.streams[key].read = []uint64{10, 12}
	as.mu.Unlock()
	as.readEnded(key, true, 13)
	require.Eventually(t, func() bool { c := as.caughtUp()[key]; return c.outDone }, 10*time.Second, time.Millisecond)
	require.Equal(t, caughtUpStream{at: 13, settled: false, outDone: true}, as.caughtUp()[key],
		"10 was read again from the copy, not acked out yet: only the ack floor can say")
	as.ackOut(key, []jetstream.Msg{m(10)}, mayAck)
	require.Eventually(t, func() bool { return as.caughtUp()[key].settled }, 10*time.Second, time.Millisecond,
		"every event read again was acked out: settled here")

	// Live again (goLive's bookkeeping without the bucket): a late copy of
	// an event the re-read covered is acked; later ones go as usual.
	as.mu.Lock()
	delete(as.streams, key)
	as.reread[key] = [][2]uint64{{10, 12}}
	as.mu.Unlock()
	late := m(11)
	require.True(t, as.takes(key, late, mayAck))
	require.EqualValues(t, 1, late.acks.Load())
	require.False(t, as.takes(key, m(13), mayAck))
	require.False(t, as.takes(key, m(9), mayAck))

	// Past the lease deadline nothing is acked, but the event is still
	// taken (it comes back by AckWait).
	as.streams[key] = &asideStream{rec: asideRecord{Start: 20, From: 20}, out: map[uint64]bool{}, whole: true}
	fenced := m(21)
	require.True(t, as.takes(key, fenced, func() error { return errLeasePassed }))
	require.Zero(t, fenced.acks.Load())
	require.False(t, as.streams[key].outDone(), "an ack-out not sent keeps the stream aside")
}

// A stream aside for OrderStuckAfter or longer, its head still refused in
// place, is counted in jsbridge_consumer_streams_set_aside_stuck (on the
// engine's clock, at most once a second); not one whose stream is parked
// (listed as parked), and not once it is live again or its partition was
// released.
func TestAsidesCountTheStuckOnes(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	as := newAsides(nil, "sub", 0, "r1", clock, slog.New(slog.DiscardHandler), nil, nil)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "stuck"})
	as.stuckGauge, as.stuckAfter = g, 5*time.Minute
	notParked := func(string) bool { return false }
	aside := func(key string, rec asideRecord) {
		rec.At = clock.Now()
		as.streams[key] = &asideStream{rec: rec, out: map[uint64]bool{}, whole: true}
	}
	aside("refused", asideRecord{Subject: "ordered.events.0.order.order-1.A"})
	aside("parked", asideRecord{Subject: "ordered.events.0.order.order-2.A", Parked: true})
	aside("dead-lettered", asideRecord{Subject: "ordered.events.0.order.order-3.A"})
	parked := func(subject string) bool { return subject == "ordered.events.0.order.order-3.A" }

	as.tendStuck(parked)
	require.Zero(t, testutil.ToFloat64(g), "none aside for the bound yet")
	clock.Advance(5*time.Minute - time.Second)
	as.tendStuck(parked)
	require.Zero(t, testutil.ToFloat64(g))
	clock.Advance(time.Second)
	as.tendStuck(parked)
	require.Equal(t, 1.0, testutil.ToFloat64(g), "the stream whose head is refused in place, not the parked ones")
	as.tendStuck(notParked)
	require.Equal(t, 1.0, testutil.ToFloat64(g), "counted at most once a second")
	clock.Advance(time.Second)
	as.tendStuck(notParked)
	require.Equal(t, 2.0, testutil.ToFloat64(g), "unparked with its record still there: refused again")

	// Live again (goLive's bookkeeping), then the partition released.
	as.mu.Lock()
	as.countStuck(as.streams["refused"], false)
	delete(as.streams, "refused")
	as.mu.Unlock()
	require.Equal(t, 1.0, testutil.ToFloat64(g))
	as.released()
	require.Zero(t, testutil.ToFloat64(g), "a released partition's streams are uncounted")
}

// A move of a stream's aside record that landed although its answer was
// lost is not tried again against a revision that moved: the next try
// finds the record saying what it writes and goes on from its revision.
// Before, each of the 10 tries failed on the moved revision and the
// partition was released.
func TestAnAsideRecordMoveWhoseAnswerWasLostIsNotRetriedForEver(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	ctx := context.Background()
	bucket, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	kv := &answerLostKV{KeyValue: bucket}
	as := newAsides(kv, "sub", 0, "r1", clockwork.NewFakeClock(), slog.New(slog.DiscardHandler), nil, nil)
	m := newAckMsg(10)
	key := wire.StreamKey(m.Subject())
	require.NoError(t, as.record(ctx, key, refusedHead{subject: m.Subject(), seq: 4}, 10))

	kv.lose.Store(true)
	require.ErrorIs(t, as.settle(ctx, m), nats.ErrNoResponders, "the move landed, its answer did not")
	require.NoError(t, as.settle(ctx, m), "tried again: the record says it already")
	require.NoError(t, as.settle(ctx, newAckMsg(11)), "and the next move goes on from there")
	e, err := bucket.Get(ctx, wire.AsideKey("sub", 0, key))
	require.NoError(t, err)
	var rec asideRecord
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	require.Equal(t, uint64(12), rec.From)
}
