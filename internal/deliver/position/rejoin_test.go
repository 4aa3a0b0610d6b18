package position

import (
	"context"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// An unordered cursor rejoins only from a floor at or above its Above:
// the record has no place for those entries, and the shared read from a
// lower floor would send them again.
func TestRejoinRefusesACursorWithEventsSettledAboveItsFloor(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	p := claim(t, js, kv, "replica-a", 1, clockwork.NewFakeClock())
	run(t, p)
	p.Edit(func(r *Record) { r.Floor, r.Members["u"] = 10, 10 })
	require.True(t, p.Detach("u", "behind"))
	require.True(t, p.EditCursor("u", func(c *Cursor) { c.Above = []uint64{14, 12} }))
	require.False(t, p.Rejoin("u"), "its Above is above its floor")
	require.Contains(t, p.Cursors(), "u")
	require.True(t, p.EditCursor("u", func(c *Cursor) { c.Floor = 14 }))
	require.True(t, p.Rejoin("u"))
	require.NoError(t, p.Flush(context.Background()))
	r, _ := stored(t, kv)
	require.Equal(t, uint64(14), r.Members["u"])
}
