package fanout

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// A parked stream stays parked until the operator's request: one naming
// another head is deleted unapplied; the right one (after a replay
// delivered the head) makes the stream's later events go out in order,
// the first naming the head's version, the chain unbroken; the stream
// rejoins the shared read, and the request is deleted once applied.
func TestAParkedStreamIsReadAgainAfterTheOperatorsRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	rq := unpark.New(b.kv, nil)
	require.NoError(t, rq.Start(t.Context()))
	t.Cleanup(rq.Stop)
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 3 && d.Attempt < 100 {
			return Settlement{Act: Park}
		}
		return Settlement{Act: Delivered}
	})
	st := &store{}
	f := New(Config{Archetype: base.New(b.clock, nil, ""), Requests: rq}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, st)
	t.Cleanup(f.Close)
	evs := events(1, 10, 2) // order-0: 1, 3, 5, 7, 9 (versions 0-4); order-1: 2, 4, 6, 8, 10
	st.add(evs...)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 10 }, "the floor passes the parked stream")
	require.ElementsMatch(t, []uint64{1, 2, 3, 4, 6, 8, 10}, rec.seqs("s"), "3 dead-lettered, the stream's later ones held")
	parked := "events.order.order-0"
	require.Equal(t, []position.Aside{{Sub: "s", Stream: parked, From: 3, State: AsideParked}}, pos.Record().Asides)

	require.ErrorIs(t, unpark.Write(t.Context(), b.kv, "s", parked, unpark.Request{}), unpark.ErrInvalid, "Head 0 is refused")
	require.NoError(t, unpark.Write(t.Context(), b.kv, "s", parked, unpark.Request{Head: 5, Previous: 1}))
	eventually(t, func() bool {
		_, err := f.CatchUp(t.Context())
		require.NoError(t, err)
		_, err = b.kv.Get(t.Context(), unpark.Key("s", parked))
		return err == jetstream.ErrKeyNotFound
	}, "a request naming another head is deleted")
	require.Len(t, pos.Record().Asides, 1, "unapplied: the stream stays parked")

	// consumer dlq replay POSTed the head (version 1) itself.
	require.NoError(t, unpark.Write(t.Context(), b.kv, "s", parked, unpark.Request{Head: 3, Previous: 1, Op: "replay"}))
	eventually(t, func() bool {
		n, err := f.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(rec.seqs("s")) == 10
	}, "the stream's later events go out and it rejoins")
	var got []sent
	for _, s := range rec.of("s") {
		if s.stream == parked {
			got = append(got, s)
		}
	}
	require.Equal(t, []sent{{1, parked, NoPrevious}, {3, parked, 0}, {5, parked, 1}, {7, parked, 2}, {9, parked, 3}}, got, "in order, the chain unbroken")
	require.Empty(t, pos.Record().Asides)
	eventually(t, func() bool {
		_, err := b.kv.Get(t.Context(), unpark.Key("s", parked))
		return err == jetstream.ErrKeyNotFound
	}, "the applied request is deleted")
	f.Dispatch(event(11, "order-0", 5))
	eventually(t, func() bool { return len(rec.seqs("s")) == 11 }, "the stream is live again")
	require.Equal(t, sent{11, parked, 4}, rec.of("s")[10])
	eventually(t, func() bool { return f.Floor() == 11 }, "the floor rises past all")
}

// A request written while nobody owns the partition is applied by its
// next owner: a skip (the head not sent) makes the stream's successor
// name the head's own predecessor.
func TestANewOwnerAppliesASkipWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 8, 2) // order-0: 1, 3, 5, 7 (versions 0-3)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	first := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 3 {
			return Settlement{Act: Park}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 8 }, "the floor passes the parked stream")
	f.Close()
	stop()
	parked := "events.order.order-0"
	require.NoError(t, unpark.Write(t.Context(), b.kv, "s", parked, unpark.Request{Head: 3, Previous: 0, Op: "skip"}))

	pos2, _ := b.claim(t, "replica-b", 2)
	rq := unpark.New(b.kv, nil)
	require.NoError(t, rq.Start(t.Context()))
	t.Cleanup(rq.Stop)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, ""), Requests: rq}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(second.seqs("s")) == 2
	}, "the stream's later events go out and it rejoins")
	require.Equal(t, []sent{{5, parked, 0}, {7, parked, 2}}, second.of("s"), "the skipped head's predecessor first")
	eventually(t, func() bool {
		_, err := b.kv.Get(t.Context(), unpark.Key("s", parked))
		return err == jetstream.ErrKeyNotFound
	}, "the request is deleted")
	require.Empty(t, pos2.Record().Asides)
}
