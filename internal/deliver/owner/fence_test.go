package owner

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// fence returns a fence on a fake clock whose deadline is 3 s away.
func fence(t *testing.T) (*Fence, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	return NewFence(t.Context(), clock, clock.Now().Add(3*time.Second)), clock
}

// A POST running when the lease deadline passes without a renewal is cut
// there; a renewal before it moves the cut; Lose cuts it at once.
func TestLeaseBoundCutsAPostAtTheDeadline(t *testing.T) {
	t.Parallel()
	f, clock := fence(t) // deadline in 3 s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pctx, done, err := f.Bound(ctx)
	require.NoError(t, err)
	defer done()
	clock.Advance(2 * time.Second)
	f.SetDeadline(clock.Now().Add(3 * time.Second)) // renewed: now 3 s from here
	clock.Advance(2 * time.Second)                  // past the first deadline
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the cut waits for the renewed deadline")
	require.NoError(t, pctx.Err(), "the renewal moved the cut")
	clock.Advance(time.Second + time.Millisecond)
	require.Eventually(t, func() bool { return pctx.Err() != nil }, 5*time.Second, time.Millisecond, "cut at the renewed deadline")
	require.ErrorIs(t, context.Cause(pctx), ErrLeasePassed)
	_, _, err = f.Bound(ctx)
	require.ErrorIs(t, err, ErrLeasePassed, "no POST starts past the deadline")

	f.SetDeadline(clock.Now().Add(3 * time.Second))
	pctx2, done2, err := f.Bound(ctx)
	require.NoError(t, err)
	defer done2()
	f.Lose()
	require.ErrorIs(t, context.Cause(pctx2), ErrLeasePassed, "Lose cuts a POST at once")
	f.SetDeadline(clock.Now().Add(3 * time.Second))
	require.False(t, f.MayStart(), "no renewal moves a lost lease's deadline again")
	require.True(t, fenceLost(f))
}

// A released claim (its context ended) starts no POST, while its lease
// still holds for the POSTs running.
func TestFenceOfAReleasedClaimStartsNothing(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	ctx, release := context.WithCancel(t.Context())
	f := NewFence(ctx, clock, clock.Now().Add(3*time.Second))
	pctx, done, err := f.Bound(context.Background())
	require.NoError(t, err)
	defer done()
	release()
	require.False(t, f.MayStart())
	require.True(t, fenceHeld(f), "the lease holds for what runs")
	require.NoError(t, pctx.Err(), "a POST running is not cut by the release")
	_, _, err = f.Bound(context.Background())
	require.ErrorIs(t, err, ErrLeasePassed)
}

// Lease time across a suspended VM: the monotonic clock (the fake one
// here) stops while the machine is suspended, the wall clock does not. A
// replica woken after a suspension longer than its lease holds nothing:
// no POST starts; a renewal after the wake holds again.
func TestFenceWokenAfterASuspensionLongerThanItsLeaseHoldsNothing(t *testing.T) {
	t.Parallel()
	f, clock := fence(t)
	var suspended atomic.Int64 // wall time the fake (monotonic) clock missed
	setWallClock(f, func(t time.Time) time.Time { return t.Add(time.Duration(suspended.Load())) })
	f.SetDeadline(clock.Now().Add(3 * time.Second))
	require.True(t, f.MayStart())

	clock.Advance(time.Second)
	suspended.Store(int64(10 * time.Second)) // suspended for 10 s; the monotonic clock saw none of it
	require.True(t, clock.Now().Before(fenceDeadline(f)), "the monotonic reading alone says the lease holds")
	require.False(t, f.MayStart(), "no POST starts")
	require.False(t, fenceHeld(f))
	_, _, err := f.Bound(context.Background())
	require.ErrorIs(t, err, ErrLeasePassed)

	f.SetDeadline(clock.Now().Add(3 * time.Second)) // a renewal after the wake, read on both clocks
	require.True(t, f.MayStart())
}

// The production reading of the wall clock: a time with a monotonic
// reading compares on it alone; the fence compares the wall readings too.
func TestLeaseFenceReadsTheWallClockOfRealTimes(t *testing.T) {
	t.Parallel()
	f := NewFence(context.Background(), clockwork.NewRealClock(), time.Time{})
	f.SetDeadline(time.Now().Add(time.Minute))
	require.True(t, f.MayStart())
	require.Equal(t, f.deadline.Round(0), f.wallDeadline, "the wall reading of the deadline, fixed when set")
	require.False(t, strings.Contains(f.wallDeadline.String(), "m="), "no monotonic reading")
}

// The POSTs running share one watch: each is cut at the deadline it runs
// under, also one bound after the wall clock stepped forward, which
// brings the deadline closer than the watch was armed for; a POST that
// ended is not cut.
func TestFenceCutsEveryPostRunningAtItsDeadline(t *testing.T) {
	t.Parallel()
	f, clock := fence(t) // deadline in 3 s
	var stepped atomic.Int64
	setWallClock(f, func(t time.Time) time.Time { return t.Add(time.Duration(stepped.Load())) })
	f.SetDeadline(clock.Now().Add(3 * time.Second))
	first, done1, err := f.Bound(context.Background())
	require.NoError(t, err)
	defer done1()
	ended, done2, err := f.Bound(context.Background())
	require.NoError(t, err)
	done2()
	require.ErrorIs(t, context.Cause(ended), context.Canceled, "ended by its caller, not cut")

	stepped.Store(int64(2 * time.Second)) // the wall clock jumps: 1 s left on it
	third, done3, err := f.Bound(context.Background())
	require.NoError(t, err)
	defer done3()
	clock.Advance(time.Second + time.Millisecond)
	require.Eventually(t, func() bool { return first.Err() != nil && third.Err() != nil }, 5*time.Second, time.Millisecond,
		"cut at the deadline the wall clock brought closer")
	require.ErrorIs(t, context.Cause(first), ErrLeasePassed)
	require.ErrorIs(t, context.Cause(third), ErrLeasePassed)
	require.ErrorIs(t, context.Cause(ended), context.Canceled)
}

// A POST's end says whether the lease had passed by then: not while it
// holds, yes once the deadline passed (cut or not yet), and after Lose.
func TestFenceEndSaysWhetherTheLeasePassed(t *testing.T) {
	t.Parallel()
	f, clock := fence(t) // deadline in 3 s
	_, end, err := f.Bound(context.Background())
	require.NoError(t, err)
	require.False(t, end(), "ended inside the lease")

	_, end, err = f.Bound(context.Background())
	require.NoError(t, err)
	clock.Advance(3*time.Second + time.Millisecond)
	require.True(t, end(), "ended past the deadline")

	f.SetDeadline(clock.Now().Add(3 * time.Second))
	_, end, err = f.Bound(context.Background())
	require.NoError(t, err)
	f.Lose()
	require.True(t, end(), "ended after the lease was lost")
}

// BenchmarkFenceBound is an ordered POST's way through the lease fence:
// Bound, then its cancel once the POST ended (issue 33).
func BenchmarkFenceBound(b *testing.B) {
	f := NewFence(context.Background(), clockwork.NewRealClock(), time.Now().Add(time.Hour))
	ctx := context.WithoutCancel(context.Background())
	b.ReportAllocs()
	for b.Loop() {
		_, done, err := f.Bound(ctx)
		if err != nil {
			b.Fatal(err)
		}
		done()
	}
}

// setWallClock replaces how f takes the wall-clock reading of a time, to
// suspend the wall clock apart from a fake monotonic one; call
// SetDeadline after it.
func setWallClock(f *Fence, wallOf func(t time.Time) time.Time) {
	f.mu.Lock()
	f.wallOf = wallOf
	f.mu.Unlock()
}

// fenceLost reports whether f.Lose was called.
func fenceLost(f *Fence) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost
}

// fenceHeld reports whether f's lease deadline has not passed (on either
// clock) and the lease was not lost: a released claim keeps its lease
// until its deliveries end, so it may hold when MayStart does not.
func fenceHeld(f *Fence) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, held := f.leftLocked()
	return held
}

// fenceDeadline returns f's deadline as last set (zero after Lose).
func fenceDeadline(f *Fence) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadline
}
