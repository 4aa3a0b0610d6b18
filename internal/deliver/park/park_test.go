package park_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// msg is an event of the partitioned copy, as a partition pulled it:
// stream's event of version, id and copy sequence seq. Only what parking
// reads is there.
type msg struct {
	jetstream.Msg
	subject string
	h       nats.Header
	md      *jetstream.MsgMetadata
}

func newMsg(stream string, version int64, seq uint64) *msg {
	h := nats.Header{}
	h.Set(wire.HeaderStreamVersion, strconv.FormatInt(version, 10))
	h.Set(wire.HeaderMsgID, strconv.FormatUint(100+seq, 10))
	md := &jetstream.MsgMetadata{Timestamp: time.Now()}
	md.Sequence.Stream = seq
	return &msg{subject: "ordered.events.0.order.order-" + stream + ".OrderNoted", h: h, md: md}
}

func (m *msg) Subject() string                           { return m.subject }
func (m *msg) Headers() nats.Header                      { return m.h }
func (m *msg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }

// eventID is m's event id (the head a park entry names).
func (m *msg) eventID() string { return m.h.Get(wire.HeaderMsgID) }

// holder is a partition as parking sees it, recording what it was asked
// to send, by copy sequence.
type holder struct {
	park.Holder
	mu                     sync.Mutex
	acks, naks, inProgress []uint64
}

func newHolder(p int) *holder {
	h := &holder{}
	seq := func(m jetstream.Msg) uint64 { md, _ := m.Metadata(); return md.Sequence.Stream }
	h.Holder = park.Holder{
		P:   p,
		Ack: func(m jetstream.Msg) { h.mu.Lock(); h.acks = append(h.acks, seq(m)); h.mu.Unlock() },
		InProgress: func(m jetstream.Msg) error {
			h.mu.Lock()
			h.inProgress = append(h.inProgress, seq(m))
			h.mu.Unlock()
			return nil
		},
		Nak: func(m jetstream.Msg) { h.mu.Lock(); h.naks = append(h.naks, seq(m)); h.mu.Unlock() },
	}
	return h
}

func (h *holder) sent() (acks, naks, inProgress []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]uint64(nil), h.acks...), append([]uint64(nil), h.naks...), append([]uint64(nil), h.inProgress...)
}

// seqs are the copy sequences of ms.
func seqs(ms []jetstream.Msg) []uint64 {
	var out []uint64
	for _, m := range ms {
		md, _ := m.Metadata()
		out = append(out, md.Sequence.Stream)
	}
	return out
}

// bundle is a park bucket on an embedded JetStream, and a subscription's
// parking on it with a fake clock.
type bundle struct {
	ctx   context.Context
	kv    jetstream.KeyValue
	clock *clockwork.FakeClock
	pk    *park.Parking
	gauge *prometheus.GaugeVec
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	b := &bundle{ctx: ctx, kv: kv, clock: clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "parked"}, []string{"subscription"})}
	b.pk = park.New(park.Config{Subscription: "orders", AckWait: 10 * time.Second, ReplicaID: "r1", CopyStream: "EVENTS_ORDERED"},
		park.Deps{Clock: b.clock, Metrics: park.Metrics{Parked: b.gauge}})
	b.pk.Provisioned(kv, "events")
	return b
}

// entryKey is the park bucket key of m's stream.
func entryKey(m jetstream.Msg) string {
	return wire.ParkedKey("orders", wire.StreamKey(wire.EventsSubject("events", m.Subject())))
}

// entry reads m's stream's park entry.
func (b *bundle) entry(t *testing.T, m jetstream.Msg) deadletter.ParkedStream {
	t.Helper()
	e, err := b.kv.Get(b.ctx, entryKey(m))
	require.NoError(t, err)
	var ps deadletter.ParkedStream
	require.NoError(t, json.Unmarshal(e.Value(), &ps))
	return ps
}

// Parking a stream behind its dead-lettered head writes its entry and
// holds its later events, in stream order whatever order they come in;
// the head redelivered (its ack lost) is acked, not held; other streams
// and other partitions' streams go on. Released, a holder's events go
// back to JetStream (Nak), others' stay held.
func TestParkHoldsTheStreamsLaterEventsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, other := newHolder(3), newHolder(4)
	head := newMsg("o1", 3, 10)
	require.NoError(t, b.pk.Park(&h.Holder, head, deadletter.Letter{EventID: head.eventID(), Reason: "HTTP 400"}))
	ps := b.entry(t, head)
	require.Equal(t, "order-o1", ps.Stream)
	require.Equal(t, head.eventID(), ps.HeadEventID)
	require.Equal(t, "3", ps.HeadVersion)
	require.Equal(t, 3, ps.Partition)
	require.Equal(t, "r1", ps.Replica)
	require.Equal(t, b.clock.Now(), ps.ParkedAt)
	require.True(t, b.pk.IsParked(head.Subject()))

	for _, seq := range []uint64{13, 11, 12} {
		m := newMsg("o1", int64(seq-7), seq)
		require.True(t, b.pk.Hold(&h.Holder, m), "later event %d held", seq)
	}
	require.True(t, b.pk.Hold(&h.Holder, head), "the head, redelivered")
	acks, _, _ := h.sent()
	require.Equal(t, []uint64{10}, acks, "the head redelivered is acked")
	require.False(t, b.pk.Hold(&h.Holder, newMsg("o2", 0, 14)), "another stream goes on")

	held, total := b.pk.HeldBy(&h.Holder)
	require.Equal(t, 3, total)
	require.Equal(t, map[string]string{wire.StreamKey(head.Subject()): head.Subject()}, held)
	got := map[uint64]bool{}
	b.pk.AddHeld(&h.Holder, got)
	require.Equal(t, map[uint64]bool{11: true, 12: true, 13: true}, got)

	require.True(t, b.pk.Hold(&other.Holder, newMsg("o1", 7, 14)), "held for another partition")
	b.pk.ReturnHeld(&h.Holder)
	_, naks, _ := h.sent()
	require.Equal(t, []uint64{11, 12, 13}, naks, "a released holder's events go back, in stream order")
	_, total = b.pk.HeldBy(&h.Holder)
	require.Zero(t, total)
	_, total = b.pk.HeldBy(&other.Holder)
	require.Equal(t, 1, total, "another holder's event stays held")
	require.Equal(t, []uint64{14}, seqs(b.pk.TakeHeld(&other.Holder, head.Subject())), "taken out to be set aside")
	_, total = b.pk.HeldBy(&other.Holder)
	require.Zero(t, total)
}

// The watch loads the existing entries before it says ready (partitions
// start only then); an entry deleted (replay, skip) unparks its stream:
// its events still arriving are held until its holder's run loop takes
// them, in stream order, and then the stream goes on.
func TestWatchUnparksAndReleasesTheHeldEventsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHolder(0)
	head := newMsg("o1", 0, 20)
	v, err := json.Marshal(deadletter.ParkedStream{Subscription: "orders", Stream: "order-o1", HeadEventID: head.eventID()})
	require.NoError(t, err)
	_, err = b.kv.Create(b.ctx, entryKey(head), v)
	require.NoError(t, err)

	ctx, stop := context.WithCancel(b.ctx)
	ready, done := make(chan struct{}), make(chan struct{})
	go func() { b.pk.Run(ctx, ready); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-ready:
	case <-b.ctx.Done():
		t.Fatal("the watch never said ready")
	}
	require.True(t, b.pk.IsParked(head.Subject()), "parked before ready")
	require.True(t, b.pk.Hold(&h.Holder, newMsg("o1", 2, 22)))
	require.True(t, b.pk.Hold(&h.Holder, newMsg("o1", 1, 21)))
	require.Empty(t, b.pk.ReleaseFor(&h.Holder), "nothing released while parked")

	require.NoError(t, b.kv.Delete(b.ctx, entryKey(head)))
	require.Eventually(t, func() bool { return !b.pk.IsParked(head.Subject()) }, 10*time.Second, 5*time.Millisecond, "unparked")
	require.True(t, b.pk.Hold(&h.Holder, newMsg("o1", 3, 23)), "still held until the run loop takes them")
	require.Equal(t, []uint64{21, 22, 23}, seqs(b.pk.ReleaseFor(&h.Holder)))
	require.False(t, b.pk.Hold(&h.Holder, newMsg("o1", 4, 24)), "released: the stream goes on")
}

// A park entry written while the watch is away (re-subscribing, so this
// replica's cache does not have it) is found by Reread, which a new owner
// runs before its fence passes: the stream's later events are held, not
// delivered; other streams are not.
func TestParkWrittenWhileTheWatchIsAwayHoldsTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHolder(0)
	require.NoError(t, b.pk.Reread(b.ctx), "an empty bucket")

	// Another replica parks order-1 behind event 5; this replica's watch
	// never sees it.
	later := newMsg("1", 1, 11)
	v, err := json.Marshal(deadletter.ParkedStream{Subscription: "orders", Stream: "order-1", HeadEventID: "5"})
	require.NoError(t, err)
	_, err = b.kv.Create(b.ctx, entryKey(later), v)
	require.NoError(t, err)
	require.False(t, b.pk.Hold(&h.Holder, later), "the cache does not know the park")

	require.NoError(t, b.pk.Reread(b.ctx))
	require.True(t, b.pk.Hold(&h.Holder, later), "after the re-read the stream's later event is held")
	require.False(t, b.pk.Hold(&h.Holder, newMsg("2", 0, 12)), "another stream goes on")
}

// The keep-alive sends InProgress for every held event each tick
// (min(AckWait/2, 5 s) of the engine's clock), sets the parked gauge and
// records the held count and the oldest held time in the stream's entry;
// with the copy's MaxAge passed, the entry names the event at risk and
// the cause.
func TestKeepAliveKeepsHeldEventsAndReportsThemInTheEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	maxAge := time.Hour
	b.pk = park.New(park.Config{Subscription: "orders", AckWait: 30 * time.Second, ReplicaID: "r1", CopyStream: "EVENTS_ORDERED"},
		park.Deps{Clock: b.clock, Metrics: park.Metrics{Parked: b.gauge}, CopyMaxAge: func() time.Duration { return maxAge }})
	b.pk.Provisioned(b.kv, "events")
	h := newHolder(0)
	head := newMsg("o1", 0, 30)
	require.NoError(t, b.pk.Park(&h.Holder, head, deadletter.Letter{EventID: head.eventID()}))
	old := newMsg("o1", 1, 31)
	old.md.Timestamp = b.clock.Now().Add(-2 * time.Hour) // in the copy for longer than its MaxAge
	require.True(t, b.pk.Hold(&h.Holder, old))
	heldAt := b.clock.Now()

	ctx, stop := context.WithCancel(b.ctx)
	done := make(chan struct{})
	ready := make(chan struct{})
	go func() { b.pk.Run(ctx, ready); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	require.NoError(t, b.clock.BlockUntilContext(b.ctx, 1))
	b.clock.Advance(5 * time.Second)
	require.Eventually(t, func() bool {
		_, _, ip := h.sent()
		return len(ip) == 1 && b.entry(t, head).Held == 1
	}, 10*time.Second, 5*time.Millisecond, "InProgress sent and the entry updated")
	_, _, ip := h.sent()
	require.Equal(t, []uint64{31}, ip)
	require.Equal(t, 1.0, testutil.ToFloat64(b.gauge.WithLabelValues("orders")))
	e := b.entry(t, head)
	require.Equal(t, heldAt, e.OldestHeldAt)
	require.Equal(t, old.eventID(), e.AtRiskEventID)
	require.Equal(t, maxAge, e.CopyMaxAge)
	require.Contains(t, e.Error, "past the partitioned copy EVENTS_ORDERED's MaxAge 1h0m0s")
}

// Under -race: partitions holding their parked streams' events while the
// keep-alive ticks, the watch unparks them and their run loops release
// them; each partition gets back every event it held, in stream order.
func TestParkingUnderConcurrentPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const partitions, events = 4, 50
	holders := make([]*holder, partitions)
	heads := make([]*msg, partitions)
	for p := range partitions {
		holders[p] = newHolder(p)
		heads[p] = newMsg(strconv.Itoa(p), 0, uint64(p*1000))
		require.NoError(t, b.pk.Park(&holders[p].Holder, heads[p], deadletter.Letter{EventID: heads[p].eventID()}))
	}
	ctx, stop := context.WithCancel(b.ctx)
	ready, done := make(chan struct{}), make(chan struct{})
	go func() { b.pk.Run(ctx, ready); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	<-ready

	var wg sync.WaitGroup
	for p := range partitions {
		wg.Go(func() {
			h := &holders[p].Holder
			for i := events; i >= 1; i-- { // newest first: Hold keeps stream order
				assert.True(t, b.pk.Hold(h, newMsg(strconv.Itoa(p), int64(i), uint64(p*1000+i))), "held")
				b.pk.HeldBy(h)
				b.pk.AddHeld(h, map[uint64]bool{})
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			b.clock.Advance(5 * time.Second) // keep-alive ticks
		}
	})
	wg.Wait()
	for p := range partitions {
		require.NoError(t, b.kv.Delete(b.ctx, entryKey(heads[p])))
	}
	for p := range partitions {
		h := &holders[p].Holder
		var got []uint64
		require.Eventually(t, func() bool {
			got = append(got, seqs(b.pk.ReleaseFor(h))...)
			return len(got) == events
		}, 10*time.Second, 5*time.Millisecond, "partition %d gets its held events back", p)
		want := make([]uint64, events)
		for i := range want {
			want[i] = uint64(p*1000 + i + 1)
		}
		require.Equal(t, want, got, "partition %d: in stream order", p)
		require.False(t, b.pk.IsParked(heads[p].Subject()))
	}
}
