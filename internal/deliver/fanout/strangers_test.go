package fanout

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// An owner whose Members lack a subscription the record lists live (a
// stranger) holds its place: a StateHeld cursor from where it stood, the
// floor passing it. An owner that has it takes the cursor as behind,
// sends it every event from there once, in order, and it rejoins.
func TestAStrangerIsHeldThenResumedByAnOwnerThatHasIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	both := members(t, member.Member{Name: "s1", Filters: []string{"events.order.>"}, Ordered: true},
		member.Member{Name: "s2", Filters: []string{"events.order.>"}, Ordered: true})
	s1Only := members(t, member.Member{Name: "s1", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 30, 3)
	st := &store{}
	st.add(evs...)

	// a, with both, delivers 1–10.
	pos, stop := b.claim(t, "replica-a", 1)
	first := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, both, pos, first, nil, st)
	for _, e := range evs[:10] {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 10 }, "a settles 1 to 10")
	require.NoError(t, pos.Flush(t.Context()))
	f.Close()
	stop()

	// b, with s1 only, holds s2's place and delivers 11–20 to s1.
	pos2, stop2 := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, s1Only, pos2, second, nil, st)
	require.Equal(t, map[string]string{"s2": StateHeld}, f2.Behind())
	require.NotContains(t, pos2.Record().Members, "s2", "the floor passes it")
	for _, e := range evs[10:20] {
		f2.Dispatch(e)
	}
	eventually(t, func() bool { return f2.Floor() == 20 }, "the floor passes s2's events")
	n, err := f2.CatchUp(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "a held cursor is not read: nothing for the loop to do")
	require.Empty(t, second.of("s2"))
	require.NoError(t, pos2.Flush(t.Context()))
	f2.Close()
	stop2()

	// a again: s2 reads from its held place (11 on) and rejoins.
	pos3, _ := b.claim(t, "replica-a", 3)
	require.Equal(t, StateHeld, pos3.Cursors()["s2"].State)
	require.Equal(t, uint64(10), pos3.Cursors()["s2"].Floor)
	third := newRecorder(nil)
	f3 := New(Config{Archetype: base.New(b.clock, nil, "")}, both, pos3, third, nil, st)
	t.Cleanup(f3.Close)
	require.Equal(t, map[string]string{"s2": StateBehind}, f3.Behind())
	next := 20
	eventually(t, func() bool {
		n, err := f3.CatchUp(t.Context())
		if err != nil {
			t.Errorf("CatchUp: %v", err)
			return true
		}
		if next < len(evs) {
			f3.Dispatch(evs[next])
			next++
		}
		return n == 0 && next == len(evs)
	}, "s2 rejoins")
	eventually(t, func() bool { return f3.Floor() == 30 }, "every event settled")
	inOrder(t, third.of("s2"), evs[10:])
	inOrder(t, third.of("s1"), evs[20:])
	require.Contains(t, pos3.Record().Members, "s2", "it rejoined")
}

// A held stranger deleted for good goes: at the claim when Deleted says
// so, or by Forget on a partition that holds it; its cursor key is
// deleted after the commit.
func TestADeletedStrangerIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	both := members(t, member.Member{Name: "s1", Filters: []string{"events.order.>"}},
		member.Member{Name: "s2", Filters: []string{"events.order.>"}})
	s1Only := members(t, member.Member{Name: "s1", Filters: []string{"events.order.>"}})
	evs := events(1, 4, 2)

	pos, stop := b.claim(t, "replica-a", 1)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, both, pos, newRecorder(nil), nil, nil)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 4 }, "settled")
	require.NoError(t, pos.Flush(t.Context()))
	f.Close()
	stop()

	// Held, then forgotten (the bucket deleted it while b owns the partition).
	pos2, stop2 := b.claim(t, "replica-b", 2)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, s1Only, pos2, newRecorder(nil), nil, nil)
	require.NoError(t, pos2.Flush(t.Context()))
	_, err := b.kv.Get(t.Context(), position.CursorKey("s2", 0))
	require.NoError(t, err, "the held cursor's key is written")
	f2.Forget("s2")
	require.Empty(t, f2.Behind())
	require.NoError(t, pos2.Flush(t.Context()))
	eventually(t, func() bool {
		_, err := b.kv.Get(t.Context(), position.CursorKey("s2", 0))
		return err != nil
	}, "the cursor key is deleted")
	f2.Close()
	stop2()

	// Listed live again by a (a made-up former record), then claimed by
	// an owner that knows it was deleted: dropped at the claim.
	pos3, stop3 := b.claim(t, "replica-a", 3)
	f3 := New(Config{Archetype: base.New(b.clock, nil, "")}, both, pos3, newRecorder(nil), nil, nil)
	require.NoError(t, f3.Join("s2", 4))
	require.NoError(t, pos3.Flush(t.Context()))
	f3.Close()
	stop3()
	require.Contains(t, pos3.Record().Members, "s2")
	pos4, _ := b.claim(t, "replica-b", 4)
	f4 := New(Config{Archetype: base.New(b.clock, nil, ""), Deleted: func(sub string) bool { return sub == "s2" }}, s1Only, pos4, newRecorder(nil), nil, nil)
	t.Cleanup(f4.Close)
	require.Empty(t, f4.Behind())
	require.NotContains(t, pos4.Record().Members, "s2")
	require.NotContains(t, pos4.Cursors(), "s2")
}
