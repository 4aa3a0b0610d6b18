package fanout

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// With enough members for a members key, a subscription live at the
// floor is left out of the record's commits (the key names it, the floor
// says the rest), and a new owner still finds it: its Join from a start
// below the floor does not start it again, and it gets only the events
// after the floor.
func TestAMemberAtTheFloorLeftOutOfTheRecordIsNotRestartedByANewOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ms := []member.Member{{Name: "late", Filters: []string{"events.order.>"}}}
	for i := range 100 {
		ms = append(ms, member.Member{Name: fmt.Sprintf("m%03d", i), Filters: []string{"events.order.>"}})
	}
	idx := members(t, ms...)
	evs := events(1, 15, 3)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	first := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	for _, m := range ms {
		require.NoError(t, f.Join(m.Name, 0))
	}
	for _, e := range evs[:12] {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(first.seqs("late")) == 12 }, "late gets the first 12")
	eventually(t, func() bool { return f.Floor() == 12 }, "the floor passes every member's start")
	require.NoError(t, pos.Flush(t.Context()))
	f.Close()
	stop()

	e, err := b.kv.Get(t.Context(), position.Key(0))
	require.NoError(t, err)
	require.False(t, bytes.Contains(e.Value(), []byte("late")), "a member at the floor is not in the record's bytes")
	t.Logf("the record with 101 members at the floor: %d bytes", len(e.Value()))

	pos2, _ := b.claim(t, "replica-b", 2)
	require.Contains(t, pos2.Record().Members, "late", "read back through the members key")
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.NoError(t, f2.Join("late", 0), "its start is below the floor")
	require.Empty(t, f2.Behind(), "not started again as a cursor from its start")
	for _, e := range evs { // its reader from the floor: those at or below it are passed over
		f2.Dispatch(e)
	}
	eventually(t, func() bool { return len(second.seqs("late")) == 3 }, "late gets the events after the floor")
	require.ElementsMatch(t, []uint64{13, 14, 15}, second.seqs("late"))
	require.Empty(t, f2.Behind())
}
