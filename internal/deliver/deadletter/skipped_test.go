package deadletter

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSkippedPreviousStepsOverVersionsNotDelivered(t *testing.T) {
	t.Parallel()
	s := Skipped{Versions: []SkippedVersion{{Version: 3, Previous: 2}, {Version: 4, Previous: 2}, {Version: 0, Previous: NoPrevious}}}
	require.Equal(t, int64(5), s.Previous(5), "delivered: itself")
	require.Equal(t, int64(2), s.Previous(3))
	require.Equal(t, int64(2), s.Previous(4), "skipped after another skip: the last delivered")
	require.Equal(t, NoPrevious, s.Previous(0), "a skipped version 0: none")
	require.Equal(t, NoPrevious, s.Previous(NoPrevious))
	require.Equal(t, int64(7), Skipped{}.Previous(7))
	// A chain written across replicas (a record naming a skipped
	// version as its predecessor) resolves to a delivered one.
	chained := Skipped{Versions: []SkippedVersion{{Version: 6, Previous: 5}, {Version: 5, Previous: 1}}}
	require.Equal(t, int64(1), chained.Previous(6))
}
