package attempt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// queued waits until n attempts wait for one of s's slots.
func queued(t *testing.T, s *slots, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.queue.Len() == n
	}, 5*time.Second, time.Millisecond)
}

// With every slot taken, a slot freed goes to the waiting event of
// lowest sequence, whatever the order the attempts asked in: a hot
// ordered stream's head, older than the events that arrived on other
// streams while its predecessor was sent, is not queued behind them.
func TestSlotsGoOldestEventFirst(t *testing.T) {
	t.Parallel()
	s := newSlots(1)
	require.True(t, s.acquire(context.Background(), 1))
	got := make(chan uint64, 3)
	for i, seq := range []uint64{9, 3, 5} {
		go func() {
			if s.acquire(context.Background(), seq) {
				got <- seq
			}
		}()
		queued(t, s, i+1)
	}
	for _, want := range []uint64{3, 5, 9} {
		s.release()
		require.Equal(t, want, <-got)
		require.Equal(t, 1, s.inFlight())
	}
	s.release()
	require.Equal(t, 0, s.inFlight())
}

// An attempt whose context ends while it waits takes nothing, and the
// slot freed next goes to the others.
func TestSlotsWaiterGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	s := newSlots(1)
	require.True(t, s.acquire(context.Background(), 1))
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan bool)
	go func() { gaveUp <- !s.acquire(ctx, 2) }()
	queued(t, s, 1)
	got := make(chan uint64, 1)
	go func() {
		if s.acquire(context.Background(), 7) {
			got <- 7
		}
	}()
	queued(t, s, 2)
	cancel()
	require.True(t, <-gaveUp)
	s.release()
	require.Equal(t, uint64(7), <-got)
	require.Equal(t, 1, s.inFlight())
}
