package fanout

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// A subscription put while the partition runs gets nothing until its
// Join; joined below the head it starts as a cursor from its start (its
// key holds it), reads the events after it once, in order, and rejoins
// live; a second Join changes nothing.
func TestAJoinedSubscriptionReadsFromItsStartAndRejoins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	idx := members(t, member.Member{Name: "a", Filters: []string{"events.order.>"}, Ordered: true})
	rec := newRecorder(nil)
	st := &store{}
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, rec, nil, st)
	t.Cleanup(f.Close)
	evs := events(1, 11, 2)
	st.add(evs...)
	for _, e := range evs[:10] {
		f.Dispatch(e)
	}
	require.NoError(t, idx.Put(member.Member{Name: "n", Filters: []string{"events.order.>"}, Ordered: true}))
	f.Dispatch(evs[10])
	eventually(t, func() bool { return len(rec.seqs("a")) == 11 }, "a gets every event")
	require.Empty(t, rec.seqs("n"), "nothing goes to a subscription put and not joined")
	require.Error(t, f.SetState("n", StatePaused), "nor can it be paused before its Join")
	require.ErrorContains(t, f.Join("nobody", 0), "no such member")

	require.NoError(t, f.Join("n", 4))
	require.Equal(t, position.Cursor{State: StateBehind, Floor: 4}, pos.Cursors()["n"], "its cursor holds its start")
	require.Equal(t, map[string]string{"n": StateBehind}, f.Behind())
	require.NoError(t, f.Join("n", 0))
	require.Equal(t, uint64(4), pos.Cursors()["n"].Floor, "a second Join changes nothing")

	catchUp(t, f)
	eventually(t, func() bool { return len(rec.seqs("n")) == 7 }, "n reads the events after its start")
	inOrder(t, rec.of("n"), evs[4:])
	require.Contains(t, pos.Record().Members, "n", "it rejoined live")
	f.Dispatch(event(12, "order-0", 6))
	eventually(t, func() bool { return len(rec.seqs("n")) == 8 }, "and gets the live events")
	require.NoError(t, f.Join("n", 0))
	n, err := f.CatchUp(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "a Join of a live subscription leaves it live")
	require.Len(t, rec.seqs("n"), 8, "nothing is sent again")
}

// Joined at or above the head, a subscription is live at once from its
// start: the events up to it are not sent to it, the later ones are.
func TestASubscriptionJoinedAboveTheHeadIsLiveFromItsStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	idx := members(t, member.Member{Name: "a", Filters: []string{"events.>"}})
	rec := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, rec, nil, nil)
	t.Cleanup(f.Close)
	evs := events(1, 8, 3)
	for _, e := range evs[:3] {
		f.Dispatch(e)
	}
	require.NoError(t, idx.Put(member.Member{Name: "l", Filters: []string{"events.>"}}))
	require.NoError(t, f.Join("l", 5))
	require.Equal(t, uint64(5), pos.Record().Members["l"])
	require.Empty(t, f.Behind(), "no cursor")
	for _, e := range evs[3:] {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(rec.seqs("a")) == 8 }, "a gets every event")
	eventually(t, func() bool { return len(rec.seqs("l")) == 3 }, "l gets those after its start")
	require.ElementsMatch(t, []uint64{6, 7, 8}, rec.seqs("l"))
	eventually(t, func() bool { return f.Floor() == 8 }, "the floor rises past all")
}

// Join is idempotent across owners: a replica taking the partition over
// finds the subscriptions a former owner joined (a cursor key, a member
// entry) and does not start them again from their start.
func TestANewOwnersJoinDoesNotRestartASubscription(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "a", Filters: []string{"events.order.>"}})
	evs := events(1, 12, 3)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	first := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs[:6] {
		f.Dispatch(e)
	}
	require.NoError(t, idx.Put(member.Member{Name: "n", Filters: []string{"events.order.>"}, Ordered: true}))
	require.NoError(t, idx.Put(member.Member{Name: "l", Filters: []string{"events.order.>"}}))
	require.NoError(t, f.Join("n", 3))
	require.NoError(t, f.Join("l", 6))
	eventually(t, func() bool { return len(first.seqs("a")) == 6 }, "a gets every event")
	f.Close()
	stop() // its last commit holds n's cursor and l's member entry

	pos2, _ := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.NoError(t, f2.Join("n", 0))
	require.NoError(t, f2.Join("l", 0))
	require.Equal(t, map[string]string{"n": StateBehind}, f2.Behind())
	require.Equal(t, uint64(3), pos2.Cursors()["n"].Floor, "n reads on from its start, not from 0")
	for _, e := range evs { // its reader from the floor: those at or below it are passed over
		f2.Dispatch(e)
	}
	catchUp(t, f2)
	eventually(t, func() bool { return len(second.seqs("n")) == 9 }, "n gets the events after its start")
	inOrder(t, second.of("n"), evs[3:])
	eventually(t, func() bool { return len(second.seqs("l")) == 6 }, "l gets the events after its start")
	require.ElementsMatch(t, []uint64{7, 8, 9, 10, 11, 12}, second.seqs("l"))
}
