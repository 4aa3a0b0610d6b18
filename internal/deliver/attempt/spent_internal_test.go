package attempt

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Only a retryable answer spends an attempt of MaxDeliver; an order
// gate's refusals count from the first of an unbroken run, and turn
// stuck at the bound; a settled event is forgotten.
func TestAttemptsCountOnlyWhatSpentOne(t *testing.T) {
	t.Parallel()
	var a attempts
	s7, s8, t7 := spentKey{"s", 7}, spentKey{"s", 8}, spentKey{"t", 7}
	t0 := time.Unix(1000, 0)
	require.Equal(t, 1, a.next(s7, 0))
	a.count(s7, 1, ActRetry, t0, 0)
	require.Equal(t, 2, a.next(s7, 0), "a retryable failure spent one")
	require.Equal(t, 1, a.next(s8, 0), "per event")
	require.Equal(t, 1, a.next(t7, 0), "per subscription")
	require.Equal(t, 3, a.next(s8, 2), "on from what earlier owners spent (the retries entry)")
	a.count(s8, 3, ActRetry, t0, 0)
	require.Equal(t, 4, a.next(s8, 2), "then on from this claim's")
	for _, act := range []Act{ActThrottle, ActDisable, ActBreakerOpen, ActCut, ActNotSent, ActNotReady} {
		a.count(s7, 2, act, t0, 0)
		require.Equal(t, 2, a.next(s7, 0), "%v spends none", act)
	}

	refused, stuck := a.count(s7, 2, ActWait, t0, 5*time.Minute)
	require.Zero(t, refused)
	require.False(t, stuck)
	refused, _ = a.count(s7, 2, ActWait, t0.Add(time.Minute), 5*time.Minute)
	require.Equal(t, time.Minute, refused, "refused since the first of the run")
	a.count(s7, 2, ActThrottle, t0.Add(2*time.Minute), 5*time.Minute)
	refused, _ = a.count(s7, 2, ActWait, t0.Add(3*time.Minute), 5*time.Minute)
	require.Zero(t, refused, "another answer between starts a new run")
	refused, stuck = a.count(s7, 2, ActWait, t0.Add(8*time.Minute), 5*time.Minute)
	require.Equal(t, 5*time.Minute, refused)
	require.True(t, stuck, "refused for the bound: stuck")
	require.Equal(t, 1, a.next(s7, 0), "stuck: forgotten (it is dead-lettered)")
	refused, _ = a.count(s7, 1, ActWait, t0.Add(9*time.Minute), 0)
	require.Zero(t, refused)
	_, stuck = a.count(s7, 1, ActWait, t0.Add(time.Hour), 0)
	require.False(t, stuck, "no bound: never stuck")

	a.count(s8, 1, ActRetry, t0, 0)
	a.count(s8, 2, ActAck, t0, 0)
	require.Equal(t, 1, a.next(s8, 0), "acked: forgotten")
	a.count(t7, 1, ActRetry, t0, 0)
	a.count(t7, 2, ActDeadLetter, t0, 0)
	require.Equal(t, 1, a.next(t7, 0), "dead-lettered: forgotten")
}
