package cursor_test

import (
	"fmt"
	"testing"

	"github.com/jsbridge/jsbridge/jsbridgetest"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// A cursor's reads keep the events of its partition that its filters
// take, in stream order, at most Max a read; a read going on from where
// the last one ended reads on, and each answer says how far it is
// complete.
func TestReadsGoOnFromWhereTheLastEnded(t *testing.T) {
	t.Parallel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	part := wire.StreamPartition("order-0", 16)
	var mine []uint64 // the partition's events of category order
	for i := range 60 {
		stream := fmt.Sprintf("order-%d", i%12)
		if i%5 == 0 {
			stream = fmt.Sprintf("user-%d", i%12)
		}
		subject := wire.Subject(wire.DefaultEventsPrefix, stream, "Happened")
		ack, err := js.Publish(t.Context(), subject, []byte("{}"))
		require.NoError(t, err)
		if p, _ := wire.SubjectPartition(wire.DefaultEventsPrefix, subject, 16); p == part && wire.Category(stream) == "order" {
			mine = append(mine, ack.Sequence)
		}
	}
	require.Greater(t, len(mine), 3)

	cs := cursor.NewReader(js, reader.Config{})
	r := cursor.Read{Subscription: "s", Filters: []string{"events.order.>"}, Partition: part, After: 0, To: 60, Max: 2}
	var got []uint64
	for range len(mine) {
		evs, through, err := cs.Read(t.Context(), r)
		require.NoError(t, err)
		for _, ev := range evs {
			require.Equal(t, part, ev.Partition)
			got = append(got, ev.Seq)
		}
		if through == r.To {
			break
		}
		require.Equal(t, evs[len(evs)-1].Seq, through, "a read cut at Max is complete up to its last event")
		r.After = through
	}
	require.Equal(t, mine, got, "every event of it once, in order")

	evs, through, err := cs.Read(t.Context(), cursor.Read{Subscription: "s", Filters: []string{"events.order.>"}, Partition: part, After: 60, To: 60, Max: 2})
	require.NoError(t, err)
	require.Empty(t, evs)
	require.Equal(t, uint64(60), through, "nothing to read: complete where it starts")

	cs.Drop("s", part)
	evs, _, err = cs.Read(t.Context(), cursor.Read{Subscription: "s", Filters: []string{"events.order.>"}, Partition: part, After: 0, To: 60, Max: 1})
	require.NoError(t, err)
	require.Equal(t, []uint64{mine[0]}, []uint64{evs[0].Seq}, "dropped: a read from anywhere starts afresh")
}
