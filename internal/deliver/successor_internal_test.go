package deliver

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/wire"
)

// fakeMsg is a pulled message of the partitioned stream with a subject,
// a stream version header (none when version < 0) and a stream sequence.
type fakeMsg struct {
	jetstream.Msg
	subject string
	h       nats.Header
	md      *jetstream.MsgMetadata
}

func newFakeMsg(stream string, version int64, seq uint64) *fakeMsg {
	h := nats.Header{}
	if version >= 0 {
		h.Set(wire.HeaderStreamVersion, strconv.FormatInt(version, 10))
	}
	md := &jetstream.MsgMetadata{}
	md.Sequence.Stream = seq
	return &fakeMsg{subject: "ordered.events.0.order." + stream + ".OrderNoted", h: h, md: md}
}

func (m *fakeMsg) Subject() string                           { return m.subject }
func (m *fakeMsg) Headers() nats.Header                      { return m.h }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }

// testPartition is a partition with no JetStream behind it, on a fake
// clock: look-ups of a stream's next event answer from next (stream key →
// sequence after → next).
func testPartition(t *testing.T, next map[string]map[uint64]uint64) *partition {
	pt := newPartition(partitionDeps{clock: clockwork.NewFakeClock(), log: slog.New(slog.DiscardHandler)}, 0, nil, 0, time.Time{})
	t.Cleanup(pt.cancel)
	pt.succ.lookup = func(key string, after uint64) (uint64, error) { return next[key][after], nil }
	return pt
}

// nextCheck returns the next look-up answer, failing after 10 s without
// one.
func nextCheck(t *testing.T, pt *partition) successorCheck {
	t.Helper()
	select {
	case c := <-pt.succ.checks:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no look-up")
		return successorCheck{}
	}
}

// waitingSeqs returns the sequences of stream key's events waiting in pt.
func waitingSeqs(pt *partition, key string) []uint64 {
	var out []uint64
	for _, w := range pt.book.waiting[key] {
		out = append(out, streamSeq(w.msg))
	}
	return out
}

func TestHandOnTakesTheNextVersionAtOnce(t *testing.T) {
	t.Parallel()
	pt := testPartition(t, nil)
	key := "ordered.events.0.order.order-1"
	for v := range int64(3) {
		require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", v, uint64(10+v))), "version %d", v)
	}
	require.Equal(t, streamPos{seq: 12, version: 2, versioned: true}, pt.succ.seen[key])
	// A copy of an event handed on already goes to dispatch's checks.
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 1, 11)))
	require.Equal(t, uint64(12), pt.succ.seen[key].seq)
	require.Empty(t, pt.succ.checking, "no look-up while the versions follow one another")
}

func TestHandOnHoldsAnEventWhosePredecessorWasLost(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	// Versions 0..5 at sequences 10..15; version 2 (seq 12) is lost.
	pt := testPartition(t, map[string]map[uint64]uint64{key: {11: 12}})
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 0, 10)))
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 1, 11)))
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 3, 13)), "version 3 arrived before version 2")
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 4, 14)))
	require.Equal(t, []uint64{13, 14}, waitingSeqs(pt, key))

	// JetStream answers that sequence 12 comes next: nothing goes on.
	c := nextCheck(t, pt)
	require.Equal(t, successorCheck{key: key, after: 11, next: 12}, c)
	pt.succ.answered(c)
	require.Equal(t, uint64(12), pt.succ.seen[key].next)
	require.Nil(t, pt.succ.nextWaiting(key))
	require.Equal(t, []uint64{13, 14}, waitingSeqs(pt, key))

	// Version 5 arrives: it waits behind the others, in stream order.
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 15)))
	require.Equal(t, []uint64{13, 14, 15}, waitingSeqs(pt, key))

	// The redelivered version 2 goes on, then each waiting one in turn.
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 2, 12)))
	for _, seq := range []uint64{13, 14, 15} {
		m := pt.succ.nextWaiting(key)
		require.NotNil(t, m, "sequence %d", seq)
		require.Equal(t, seq, streamSeq(m))
		require.True(t, pt.succ.handOn(key, m))
	}
	require.Nil(t, pt.succ.nextWaiting(key))
	require.Empty(t, pt.book.waiting)
}

func TestHandOnAsksJetStreamWhenTheVersionsDoNotSay(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	// A subscription filtering by event name: versions 0, 4, 9 at
	// sequences 10, 30, 55 are all it gets of the stream.
	pt := testPartition(t, map[string]map[uint64]uint64{key: {10: 30, 30: 55}})
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 0, 10)))
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 4, 30)), "the versions skip: JetStream is asked")
	c := nextCheck(t, pt)
	require.Equal(t, successorCheck{key: key, after: 10, next: 30}, c)
	// Answered: sequence 30 is the stream's next event for the
	// consumer, so it may go on.
	pt.succ.answered(c)
	m := pt.succ.nextWaiting(key)
	require.NotNil(t, m)
	require.True(t, pt.succ.handOn(key, m))
	require.Equal(t, uint64(30), pt.succ.seen[key].seq)

	// An answer for a stream handed on further meanwhile is dropped.
	pt.succ.answered(successorCheck{key: key, after: 10, next: 99})
	require.Zero(t, pt.succ.seen[key].next)

	// No version at all: asked too.
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", -1, 55)))
	require.Equal(t, successorCheck{key: key, after: 30, next: 55}, nextCheck(t, pt))
}

func TestHandOnAsksJetStreamForAStreamsFirstEventAfterTheFence(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	// The fence passed at ack floor 100; the stream's versions 4 and 5
	// are at sequences 120 and 150, and 150 arrives first (the consumer
	// leader counted 120 as neither pending nor delivered).
	pt := testPartition(t, map[string]map[uint64]uint64{key: {100: 120}})
	pt.succ.fencePassed(100)
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)), "not known to be the stream's first after the floor")
	c := nextCheck(t, pt)
	require.Equal(t, successorCheck{key: key, after: 100, next: 120}, c)
	pt.succ.answered(c)
	require.Nil(t, pt.succ.nextWaiting(key), "sequence 120 comes first")

	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 4, 120)))
	m := pt.succ.nextWaiting(key)
	require.NotNil(t, m)
	require.Equal(t, uint64(150), streamSeq(m))
	require.True(t, pt.succ.handOn(key, m))
}

func TestHandOnTrustsAStreamsFirstEventAtVersionZeroOrRightAfterTheFloor(t *testing.T) {
	t.Parallel()
	pt := testPartition(t, nil)
	pt.succ.fencePassed(100)
	require.True(t, pt.succ.handOn("ordered.events.0.order.order-1", newFakeMsg("order-1", 0, 150)), "version 0 has no predecessor")
	require.True(t, pt.succ.handOn("ordered.events.0.order.order-2", newFakeMsg("order-2", 7, 101)), "nothing lies between the floor and it")
	require.Empty(t, pt.succ.checking)

	// Before a fence passed (no floor read), the first event is left to
	// the fence, as before.
	fresh := testPartition(t, nil)
	require.True(t, fresh.succ.handOn("ordered.events.0.order.order-3", newFakeMsg("order-3", 7, 150)))
}

// The former owner acked the stream's version 4 (sequence 120) out of
// order, above the ack floor (100: another stream's head holds it), and
// wrote it in the delivered record first. The stream's version 5 (150)
// is its first event in the new owner's hand: JetStream names nothing of
// the stream between the record's 120 and 150, so it goes on at once,
// with the clock never moved (it waited six AckWaits, at least a minute,
// before the record).
func TestAStreamWhosePredecessorIsInTheDeliveredRecordGoesOnAtOnce(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, map[string]map[uint64]uint64{key: {100: 120, 120: 150}})
	pt.succ.inherited = func(k string) uint64 { return map[string]uint64{key: 120}[k] }
	pt.succ.fencePassed(100)
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)), "asked: 150 is not right after the record's 120")
	c := nextCheck(t, pt)
	require.Equal(t, successorCheck{key: key, after: 120, next: 150}, c, "looked up after the record's entry, not the floor")
	pt.succ.answered(c)
	m := pt.succ.nextWaiting(key)
	require.NotNil(t, m, "version 5 goes on")
	require.True(t, pt.succ.handOn(key, m))
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 6, 160)), "and the stream follows its versions again")

	// Right after the record's entry: no look-up at all.
	other := "ordered.events.0.order.order-2"
	pt.succ.inherited = func(k string) uint64 { return map[string]uint64{other: 130}[k] }
	require.True(t, pt.succ.handOn(other, newFakeMsg("order-2", 9, 131)))
	require.Empty(t, pt.succ.checking)
}

// A predecessor above both the ack floor and the stream's entry in the
// delivered record was never acked (acks follow the record): it is
// pending and comes back. The stream waits for it, however long, and goes
// on when it comes; no timeout lets it go before.
func TestAStreamWhosePredecessorIsPendingWaitsForIt(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, map[string]map[uint64]uint64{key: {110: 120}})
	clock := pt.clock.(*clockwork.FakeClock)
	pt.succ.inherited = func(k string) uint64 { return map[string]uint64{key: 110}[k] }
	pt.succ.fencePassed(100)
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)))
	pt.succ.answered(nextCheck(t, pt))
	require.Nil(t, pt.succ.nextWaiting(key), "sequence 120 is named first")
	clock.Advance(time.Hour)
	require.Empty(t, pt.succ.goesOn([]string{key}, 100), "the floor is below it: it is pending")
	require.Nil(t, pt.succ.nextWaiting(key))

	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 4, 120)), "the pending predecessor comes back")
	m := pt.succ.nextWaiting(key)
	require.NotNil(t, m)
	require.Equal(t, uint64(150), streamSeq(m))
}

func TestAStreamWhosePredecessorFellBelowTheFloorGoesOnAtOnce(t *testing.T) {
	t.Parallel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, map[string]map[uint64]uint64{key: {100: 120}})
	pt.succ.fencePassed(100)
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 5, 150)))
	pt.succ.answered(nextCheck(t, pt))
	require.Equal(t, []string{key}, pt.succ.goesOn([]string{key}, 130))
	require.Equal(t, uint64(130), pt.succ.seen[key].seq)
}
