package floor

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The floor is the first event still owed minus one, or the last event
// dispatched when none is owed; each step below is a dispatch (add) or a
// settlement (done) and the floor after it.
func TestTheFloorIsTheFirstEventOwedMinusOne(t *testing.T) {
	t.Parallel()
	type step struct {
		add, done uint64
		owe       int
		want      uint64
	}
	for _, tc := range []struct {
		name  string
		from  uint64
		steps []step
	}{
		{"nothing dispatched", 10, []step{{want: 10}}},
		{"owed by none: the floor follows the dispatch", 10, []step{{add: 11, want: 11}, {add: 12, want: 12}}},
		{"owed: held until settled", 10, []step{{add: 11, owe: 1, want: 10}, {add: 12, want: 10}, {done: 11, want: 12}}},
		{"two owe it: both settle", 10, []step{{add: 11, owe: 2, want: 10}, {done: 11, want: 10}, {done: 11, want: 11}}},
		{"a later event settled first waits for the earlier", 0, []step{
			{add: 1, owe: 1, want: 0}, {add: 2, owe: 1, want: 0}, {done: 2, want: 0}, {done: 1, want: 2}}},
		{"a gap in sequences (another partition's events)", 0, []step{
			{add: 3, owe: 1, want: 2}, {add: 7, owe: 1, want: 2}, {done: 3, want: 6}, {done: 7, want: 7}}},
		{"a settlement of an event not in the window changes nothing", 5, []step{
			{add: 6, owe: 1, want: 5}, {done: 4, want: 5}, {done: 9, want: 5}, {done: 6, want: 6}, {done: 6, want: 6}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := New(tc.from)
			for i, s := range tc.steps {
				switch {
				case s.add > 0:
					w.Add(s.add, "events.order.order-1.Placed", s.owe)
				case s.done > 0:
					w.Done(s.done)
				}
				require.Equal(t, s.want, w.Floor(), "after step %d", i)
			}
		})
	}
}

// What an unordered subscription's cursor gets at a detach: the events
// above the floor it takes and does not hold.
func TestSettledByIsWhatItTakesAndDoesNotHold(t *testing.T) {
	t.Parallel()
	w := New(0)
	w.Add(1, "events.order.a.X", 1)
	w.Add(2, "events.user.b.Y", 1)
	w.Add(3, "events.order.c.X", 1)
	w.Add(4, "events.order.d.X", 1)
	orders := func(subject string) bool { return strings.HasPrefix(subject, "events.order.") }
	require.Equal(t, []uint64{3, 4}, w.SettledBy(orders, map[uint64]bool{1: true}))
	w.Done(1)
	require.Equal(t, uint64(1), w.Floor())
	require.Equal(t, []uint64{4}, w.SettledBy(orders, map[uint64]bool{3: true}), "below the floor: not in the window")
}
