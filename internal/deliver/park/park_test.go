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
	require.False(t, b.pk.Hold(&h.Holder, "", later), "the cache does not know the park")

	require.NoError(t, b.pk.Reread(b.ctx))
	require.True(t, b.pk.Hold(&h.Holder, "", later), "after the re-read the stream's later event is held")
	require.False(t, b.pk.Hold(&h.Holder, "", newMsg("2", 0, 12)), "another stream goes on")
}
