package sender

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Only a retryable answer spends an attempt of MaxDeliver; an order
// gate's refusals count from the first of an unbroken run; a settled
// event is forgotten; the count goes on from earlier owners'.
func TestAttemptsCountOnlyWhatSpentOne(t *testing.T) {
	t.Parallel()
	var a attempts
	require.Equal(t, 1, a.next("s", 7, 0))
	a.failed("s", 7, 1)
	require.Equal(t, 2, a.next("s", 7, 0), "a retryable failure spent one")
	require.Equal(t, 1, a.next("s", 8, 0), "per event")
	require.Equal(t, 1, a.next("t", 7, 0), "per subscription")
	require.Equal(t, 3, a.next("s", 8, 2), "on from what earlier owners spent (the retries entry)")
	a.failed("s", 8, 3)
	require.Equal(t, 4, a.next("s", 8, 2), "then on from this claim's")

	t0 := time.Unix(1000, 0)
	require.Equal(t, t0, a.refused("s", 7, t0))
	require.Equal(t, t0, a.refused("s", 7, t0.Add(time.Minute)), "refused since the first of the run")
	a.answered("s", 7)
	require.Equal(t, t0.Add(2*time.Minute), a.refused("s", 7, t0.Add(2*time.Minute)), "another answer between starts a new run")

	a.settled("s", 7)
	require.Equal(t, 1, a.next("s", 7, 0), "settled: forgotten")
	require.Equal(t, t0.Add(3*time.Minute), a.refused("s", 7, t0.Add(3*time.Minute)))
}
