package drain

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
)

func TestGroupByStream(t *testing.T) {
	t.Parallel()
	ev := func(stream string, v int64) event.Event { return event.Event{Stream: stream, Version: v} }
	events := []event.Event{ev("a", 0), ev("a", 1), ev("b", 0), ev("a", 2), ev("c", 0)}
	events[4].Err = event.ErrLeaseLost // any error: unreadable

	got, unreadable := groupByStream(events, 3)
	require.True(t, unreadable)
	require.Equal(t, []event.Event{ev("a", 0), ev("a", 1), ev("a", 2)}, got["a"], "a stream split in two runs is joined in order")
	require.Equal(t, []event.Event{ev("b", 0)}, got["b"])
	require.Len(t, got["c"], 1)
	require.Equal(t, ev("b", 0), events[2], "joining a's runs did not write over b's event")

	got, unreadable = groupByStream(events[:2], 1)
	require.False(t, unreadable)
	got["a"] = append(got["a"], ev("a", 9))
	require.Equal(t, ev("b", 0), events[2], "appending to a run copies, not overwrites its neighbour")
}
