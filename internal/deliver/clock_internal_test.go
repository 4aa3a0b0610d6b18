package deliver

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/backoff"
)

// A partition starts no attempt past its lease deadline, and waitLease
// waits, on the engine's clock, until a renewal moves the deadline on (or
// the partition is released): no wall-clock window is waited out.
func TestPartitionWaitsPastItsLeaseDeadlineOnTheClock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pt := testPartition(t, nil)
	clock := pt.clock.(*clockwork.FakeClock)
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second))
	require.True(t, pt.lease.MayStart(), "before the deadline")
	clock.Advance(3 * time.Second)
	require.False(t, pt.lease.MayStart(), "at the deadline: a frozen replica starts nothing when it wakes")

	done := make(chan bool, 1)
	go func() { done <- pt.lease.WaitLease() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "waitLease waits on the clock")
	select {
	case <-done:
		t.Fatal("waitLease returned without a renewal")
	default:
	}
	pt.lease.SetDeadline(clock.Now().Add(3 * time.Second)) // the lease was renewed
	clock.Advance(20 * time.Millisecond)
	require.True(t, <-done, "renewed: the partition is still this replica's")

	clock.Advance(3 * time.Second)
	go func() { done <- pt.lease.WaitLease() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	pt.release()
	require.False(t, <-done, "released while waiting")
}

// A successor look-up that fails is retried after the backoff pause on the
// engine's clock; meanwhile the stream's later events wait.
func TestSuccessorLookUpRetriesAfterThePauseOnTheClock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := "ordered.events.0.order.order-1"
	pt := testPartition(t, nil)
	clock := pt.clock.(*clockwork.FakeClock)
	var calls atomic.Int32
	pt.succ.lookup = func(string, uint64) (uint64, error) {
		if calls.Add(1) == 1 {
			return 0, errors.New("stream leader moving")
		}
		return 12, nil
	}
	require.True(t, pt.succ.handOn(key, newFakeMsg("order-1", 0, 10)))
	require.False(t, pt.succ.handOn(key, newFakeMsg("order-1", 2, 12)), "version 1 not seen: JetStream is asked")
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the failed look-up pauses on the clock")
	require.Equal(t, int32(1), calls.Load())
	select {
	case c := <-pt.succ.checks:
		t.Fatalf("answer %+v before the pause ended", c)
	default:
	}
	clock.Advance(backoff.DefaultMax)
	require.Equal(t, successorCheck{key: key, after: 10, next: 12}, nextCheck(t, pt))
	require.Equal(t, int32(2), calls.Load())
}

// sleep ends with its context, the clock standing still.
func TestSleepHonoursTheContext(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sleep(ctx, clock, time.Hour); close(done) }()
	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	cancel()
	<-done
	sleep(context.Background(), clock, 0) // returns at once
}
