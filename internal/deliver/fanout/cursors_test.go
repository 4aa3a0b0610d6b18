package fanout

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// A paused subscription resumed reads its events of the partition from
// the events stream itself (cursor.Reader: reader.Cursor's direct gets),
// every one once and in order, and rejoins; the other partitions' events
// and those its filters do not take are not sent.
func TestACursorCatchesUpFromTheEventsStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	part := wire.StreamPartition("order-0", 16)
	var mine []reader.Event // the partition's events of category order
	for i := range 120 {
		stream := fmt.Sprintf("order-%d", i%12)
		if i%5 == 0 {
			stream = fmt.Sprintf("user-%d", i%12)
		}
		h := nats.Header{wire.HeaderStreamVersion: {strconv.Itoa(i / 12)}}
		subject := wire.Subject(wire.DefaultEventsPrefix, stream, "Happened")
		ack, err := b.js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Header: h, Data: []byte("{}")})
		require.NoError(t, err)
		if p, _ := wire.SubjectPartition(wire.DefaultEventsPrefix, subject, 16); p == part && wire.Category(stream) == "order" {
			mine = append(mine, reader.Event{Seq: ack.Sequence, Subject: subject, Partition: p, Header: h})
		}
	}
	require.NotEmpty(t, mine)

	cs := cursor.NewReader(b.js, reader.Config{})
	evs, through, err := cs.Read(t.Context(), cursor.Read{Subscription: "s", Filters: []string{"events.order.>"}, Partition: part, After: 0, To: 120, Max: 2})
	require.NoError(t, err)
	require.Equal(t, []uint64{mine[0].Seq, mine[1].Seq}, []uint64{evs[0].Seq, evs[1].Seq})
	require.Equal(t, mine[1].Seq, through, "a read cut at Max is complete up to its last event")

	pos, _ := b.claim(t, "replica-a", 1)
	rec := newRecorder(nil)
	f := New(Config{Partition: part, Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true, MaxInHand: 4}), pos, rec, nil, cs)
	t.Cleanup(f.Close)
	require.NoError(t, f.SetState("s", StatePaused))
	for _, e := range mine {
		f.Dispatch(e)
	}
	require.Empty(t, rec.seqs("s"))
	require.NoError(t, f.SetState("s", ""))
	catchUp(t, f)
	eventually(t, func() bool { return len(rec.seqs("s")) == len(mine) }, "every event of it once")
	inOrder(t, rec.of("s"), mine)
}
