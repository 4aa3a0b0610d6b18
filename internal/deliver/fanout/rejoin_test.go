package fanout

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// A partition claimed again while subscriptions have cursors whose
// entries lie above the record's floor (the new owner's head starts
// there): an unordered one's Above, an ordered one's stream entries.
// Once resumed, neither is sent again what its cursor says it settled,
// and each gets every other event once: a cursor rejoins the shared
// read only once the head passed what it settled.
func TestARejoiningCursorIsNotSentWhatItSettledAboveTheHead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "holder", Filters: []string{"events.order.>"}, Ordered: true, MaxInFlight: 2},
		member.Member{Name: "u", Filters: []string{"events.order.>"}},
		member.Member{Name: "o", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 8, 2) // order-0: 1, 3, 5, 7; order-1: 2, 4, 6, 8
	st := &store{}
	st.add(evs...)

	pos, stop := b.claim(t, "replica-a", 1)
	var f *Partition
	first := newRecorder(func(d Delivery) Settlement {
		if d.Subscription == "holder" && d.Event.Seq == 1 {
			<-f.ctx.Done() // its endpoint never answers: the floor stays at 0
			return Settlement{Act: Retry}
		}
		return Settlement{Act: Delivered}
	})
	f = New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs[:6] {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(first.seqs("u")) == 6 && len(first.seqs("o")) == 6 }, "u and o settle 1 to 6")
	eventually(t, func() bool { return pos.Record().Covers("holder", wire.StreamKey(evs[5].Subject), 6) }, "the holder settles order-1's")
	require.NoError(t, f.SetState("u", StatePaused))
	require.NoError(t, f.SetState("o", StatePaused))
	require.NoError(t, pos.Flush(t.Context()))
	f.Close()
	stop()
	require.Zero(t, pos.Record().Floor, "the holder kept the floor at 0")

	pos2, _ := b.claim(t, "replica-b", 2)
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, pos2.Cursors()["u"].Above, "u's cursor holds what it settled above the floor")
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.Zero(t, f2.Head())
	require.NoError(t, f2.SetState("u", ""))
	require.NoError(t, f2.SetState("o", ""))
	// The replica's loop: a cursor round, then a live event.
	next := 0
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		if err != nil {
			t.Errorf("CatchUp: %v", err)
			return true
		}
		if next < len(evs) {
			f2.Dispatch(evs[next])
			next++
		}
		return n == 0 && next == len(evs)
	}, "u and o rejoin")
	eventually(t, func() bool { return f2.Floor() == 8 }, "every event settled")
	inOrder(t, second.of("holder"), []reader.Event{evs[0], evs[2], evs[4], evs[6], evs[7]}) // it settled order-1's first three
	got := second.seqs("u")
	slices.Sort(got)
	require.Equal(t, []uint64{7, 8}, got, "u is sent nothing its cursor's Above held, the rest once")
	inOrder(t, second.of("o"), evs[6:])
	require.Empty(t, f2.Behind())
	require.Contains(t, pos2.Record().Members, "u", "it rejoined")

	f2.Dispatch(event(9, "order-0", 4))
	eventually(t, func() bool { return len(second.seqs("u")) == 3 && len(second.seqs("o")) == 3 }, "live again")
}
