package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// The lease fence (docs/ordering.md, "The lease fence"). Past its lease
// deadline a partition starts no POST, and a POST running is cut there:
// the lease key may expire on the server (TTL after the last renewal)
// and another replica claim the partition, so nothing of this owner may
// reach a receiver after the deadline, which is set 1/4 TTL before that
// (a renewal's start plus 3/4 of the TTL).
//
// The deadline is read on two clocks. A time.Time from the engine's clock
// carries a monotonic reading, and comparing two of them compares those
// only; but the monotonic clock stops while the machine (a VM) is
// suspended, while the lease key in JetStream expires on the server's
// time. A replica woken after a suspension longer than its lease would
// believe it still held it. So the lease is held only while both the
// monotonic and the wall-clock readings are before the deadline's (see
// wall): a wall clock stepped back by NTP leaves the monotonic check;
// one stepped forward ends the lease early (safe: the next renewal moves
// it again).

// ErrLeasePassed is why a POST was not started (Fence.Bound) or was cut
// (the cause of its context): the lease deadline passed, the lease was
// found lost, or the partition was released.
var ErrLeasePassed = errors.New("partition lease deadline passed")

// Fence is one claim's lease deadline and what it allows: a POST starts
// only before the deadline (on both clocks) and while the claim's context
// lives, and is cut once the deadline passes without a renewal or the
// lease is lost. Its methods are safe for concurrent use.
type Fence struct {
	ctx   context.Context // the claim's: ends at release
	clock clockwork.Clock

	mu sync.Mutex
	// wallOf returns the wall-clock reading of a time read from clock
	// (nil: t.Round(0), which drops the monotonic reading); tests set it
	// to suspend the wall clock apart from a fake monotonic one.
	wallOf   func(t time.Time) time.Time
	deadline time.Time // no POST starts after it (its monotonic reading decides)
	// wallDeadline is the deadline's wall-clock reading, fixed when the
	// deadline was set (zero: unset, taken from deadline).
	wallDeadline time.Time
	lost         bool // the lease was found lost: the deadline stays passed
	// posts are the cancels of the POSTs running inside the lease
	// (Bound): Lose ends them at once, the watch at the deadline.
	posts  map[uint64]context.CancelCauseFunc
	postID uint64
	// watch is the POSTs' one timer (nil: not made yet): armed while
	// POSTs run, it fires at the deadline (watchAt, on clock) and cuts
	// them unless a renewal moved it. One a fence, not one a POST: each
	// POST made a timer, two closures and their runtime timer (issue 33).
	watch   clockwork.Timer
	armed   bool
	watchAt time.Time
}

// NewFence returns the fence of a claim whose context is ctx (ended at
// release: from then on no POST starts) and whose lease holds until
// deadline, a time read from clock (a renewal's start plus 3/4 of the
// lease TTL).
func NewFence(ctx context.Context, clock clockwork.Clock, deadline time.Time) *Fence {
	return &Fence{ctx: ctx, clock: clock, deadline: deadline}
}

// Context is the claim's context: it ends when the partition is released
// or lost (its cause says which: ErrReleased, ErrLeaseLost, ErrStopping,
// or the caller's own for a fence made with NewFence).
func (f *Fence) Context() context.Context { return f.ctx }

// wallLocked returns t's wall-clock reading (f.mu held).
func (f *Fence) wallLocked(t time.Time) time.Time {
	if f.wallOf != nil {
		return f.wallOf(t)
	}
	return t.Round(0)
}

// SetDeadline moves the deadline to t (a lease renewal: its start on the
// clock plus 3/4 of the TTL), on both of t's clocks. After Lose it does
// nothing.
func (f *Fence) SetDeadline(t time.Time) {
	f.mu.Lock()
	if !f.lost {
		f.deadline, f.wallDeadline = t, f.wallLocked(t)
	}
	f.mu.Unlock()
}

// leftLocked returns the time left before the deadline on the clock that
// says less, and false once it passed on either (f.mu held).
func (f *Fence) leftLocked() (time.Duration, bool) {
	_, left, held := f.leftAtLocked()
	return left, held
}

// leftAtLocked is leftLocked with the clock's reading it was taken at
// (f.mu held).
func (f *Fence) leftAtLocked() (time.Time, time.Duration, bool) {
	now := f.clock.Now()
	wd := f.wallDeadline
	if wd.IsZero() {
		wd = f.wallLocked(f.deadline) // set at construction
	}
	left := min(f.deadline.Sub(now), wd.Sub(f.wallLocked(now)))
	return now, left, !f.lost && left > 0
}

// Lose ends the lease at once: a renewal found the key taken (expired and
// claimed by another replica, or overwritten), or a write fenced by the
// claim found another claim, so the deadline set is no longer this
// replica's to use. From now on nothing is started, and no late renewal
// can move the deadline again (SetDeadline after Lose is ignored): the
// new owner may have sent an event's successor already.
//
// A POST running (Bound) is cancelled too, with cause ErrLeasePassed: its
// answer is not waited for, and nothing is settled from it.
func (f *Fence) Lose() {
	f.mu.Lock()
	f.lost = true
	f.deadline, f.wallDeadline = time.Time{}, time.Time{}
	posts := f.posts
	f.posts = nil
	f.mu.Unlock()
	for _, cancel := range posts {
		cancel(ErrLeasePassed)
	}
}

// MayStart reports whether a POST may start: the claim was not released
// and its lease was renewed recently enough (a replica frozen past its
// deadline starts nothing more when it wakes up). A sender asks it right
// before each POST; Bound asks it too, atomically with binding the POST.
func (f *Fence) MayStart() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, held := f.leftLocked()
	return f.ctx.Err() == nil && held
}

// Left returns the time left before the deadline, on the clock that says
// less, and false once it passed on either or the lease was lost.
func (f *Fence) Left() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leftLocked()
}

// Bound is where a POST passes the fence: right before it goes out, after
// everything that may wait before it (a slot, a throttle, a breaker and
// its probe claim), so that no POST starts past the deadline whatever
// delayed it. It returns ErrLeasePassed when the deadline passed (or the
// claim was released), else ctx bounded by the lease: cancelled, with
// cause ErrLeasePassed, once the deadline passes without a renewal or the
// lease is lost. Renewals move the deadline, so a POST is cut only when
// its lease ends, not at the deadline it started under. The caller calls
// the returned end once the POST ended; it reports whether the lease had
// passed by then (the deadline, or lost): a POST that failed then is one
// the lease cut, whichever fired first after a freeze, the fence's timer
// or the POST's own timeout.
func (f *Fence) Bound(ctx context.Context) (context.Context, func() (passed bool), error) {
	f.mu.Lock()
	now, left, held := f.leftAtLocked()
	if !held || f.ctx.Err() != nil {
		f.mu.Unlock()
		return nil, nil, ErrLeasePassed
	}
	pctx, cancel := context.WithCancelCause(ctx)
	if f.posts == nil {
		f.posts = map[uint64]context.CancelCauseFunc{}
	}
	f.postID++
	id := f.postID
	f.posts[id] = cancel
	f.armLocked(now, left)
	f.mu.Unlock()
	return pctx, func() bool {
		f.mu.Lock()
		delete(f.posts, id)
		_, held := f.leftLocked()
		f.mu.Unlock()
		cancel(nil)
		return !held
	}, nil
}

// armLocked makes sure the watch fires no later than left after now
// (the time left before the deadline and the clock's reading it was
// taken at): a wall clock stepped forward brings the deadline closer
// than the watch was armed for (f.mu held).
func (f *Fence) armLocked(now time.Time, left time.Duration) {
	at := now.Add(left)
	switch {
	case f.watch == nil:
		f.watch = f.clock.AfterFunc(left, f.cut)
	case f.armed && !at.Before(f.watchAt):
		return
	default:
		f.watch.Reset(left)
	}
	f.armed, f.watchAt = true, at
}

// cut is the watch firing: once the deadline passed without a renewal
// (or the lease was lost), it cuts the POSTs running, with cause
// ErrLeasePassed; renewed meanwhile, it waits for the new deadline while
// POSTs run.
func (f *Fence) cut() {
	f.mu.Lock()
	f.armed = false
	if len(f.posts) == 0 {
		f.mu.Unlock()
		return
	}
	now, left, held := f.leftAtLocked()
	if held {
		f.armLocked(now, left)
		f.mu.Unlock()
		return
	}
	posts := f.posts
	f.posts = nil
	f.mu.Unlock()
	for _, cancel := range posts {
		cancel(ErrLeasePassed)
	}
}
