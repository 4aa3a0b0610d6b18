package position

import (
	"context"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
	"github.com/stretchr/testify/require"
)

// Start gives a subscription new on the partition a cursor from its
// start, below the record's floor, in one change: its key holds the
// start, a settlement of it is waited for until the key holding it is
// written (the stored floor does not speak for it), and the next owner
// loads it. A member, or one with a cursor already, is left alone.
func TestStartMakesACursorFromAStartBelowTheFloor(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	first := claim(t, js, kv, "replica-a", 1, clock)
	run(t, first)
	first.Edit(func(r *Record) { r.Floor, r.Members["live"] = 100, 0 })
	first.Settled("live", "order-9", Entry{Seq: 101, Version: 0})
	require.NoError(t, first.Wait(ctx, "live", "order-9", 101))

	require.False(t, first.StartCursor("live", "behind", 10), "a member is left alone")
	require.True(t, first.StartCursor("new", "behind", 10))
	require.False(t, first.StartCursor("new", "behind", 0), "once")
	first.Settled("new", "order-1", Entry{Seq: 20, Version: 3})
	first.mu.Lock()
	early := first.st.covered(&first.stored, "new", "order-1", 20)
	first.mu.Unlock()
	require.False(t, early, "nothing stored holds its settlement yet")
	require.NoError(t, first.Wait(ctx, "new", "order-1", 20))
	e, err := kv.Get(ctx, CursorKey("new", 0))
	require.NoError(t, err)
	c, err := record.DecodeCursor(e.Value())
	require.NoError(t, err)
	require.Equal(t, Cursor{State: "behind", Floor: 10, Streams: map[string]Entry{"order-1": {Seq: 20, Version: 3}}}, c)

	second := claim(t, js, kv, "replica-b", 2, clock)
	require.Equal(t, c, second.Cursors()["new"], "the next owner reads on from its start")
}

// Flush returns once a commit holding every change made before it
// landed: an edit no waiter covers (an aside) is in the stored record
// when it returns; with nothing to commit it returns at once.
func TestFlushWaitsForACommitHoldingTheChangesBeforeIt(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	p := claim(t, js, kv, "replica-a", 1, clockwork.NewFakeClock()) // the linger never runs out: only a waiter commits
	run(t, p)
	require.NoError(t, p.Flush(ctx), "nothing to commit")
	p.Edit(func(r *Record) {
		r.Floor = 50
		r.Asides = append(r.Asides, Aside{Sub: "s", Stream: "order-1", From: 7, State: "parked"})
	})
	require.NoError(t, p.Flush(ctx))
	r, _ := stored(t, kv)
	require.Equal(t, []Aside{{Sub: "s", Stream: "order-1", From: 7, State: "parked"}}, r.Asides)
	require.Equal(t, uint64(50), r.Floor)
}

// The floor passes a stream set aside unsettled: Covers does not count
// the aside's events settled by the floor or a member entry, only by
// the stream's entries.
func TestTheFloorDoesNotCoverAStreamSetAside(t *testing.T) {
	t.Parallel()
	r := Record{Floor: 100, Members: map[string]uint64{"s": 120},
		Asides: []Aside{{Sub: "s", Stream: "order-1", From: 40, State: "stuck"}},
		Ahead:  map[string]map[string]Entry{"s": {"order-1": {Seq: 50, Version: 3}}}}
	require.True(t, r.Covers("s", "order-1", 50), "its own entry")
	require.False(t, r.Covers("s", "order-1", 60), "set aside from 40: not the floor's")
	require.True(t, r.Covers("s", "order-2", 60), "another stream: the floor's")
	require.True(t, r.Covers("t", "order-1", 60), "another subscription: the floor's")
	require.False(t, r.Covers("s", "order-1", 110), "nor the member entry's")
	require.True(t, r.Covers("s", "order-1", 30), "below the aside")
}
