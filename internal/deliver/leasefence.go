package deliver

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// The sender's fence. Past its lease deadline (on the injected clock) a
// partition starts no POST, sends no InProgress, acks and Naks nothing and
// pulls nothing: its messages go back to JetStream by AckWait (or the next
// owner's reset). Acks and InProgress are also never sent while the NATS
// connection is down: nats.go would buffer them and flush them after the
// reconnect, maybe long after the lease ended (an ack not sent leaves the
// message pending: it is redelivered and the receiver deduplicates it).
//
// The deadline is read on two clocks. A time.Time from the engine's clock
// carries a monotonic reading, and comparing two of them compares those
// only; but the monotonic clock stops while the machine (a VM) is
// suspended, while the lease key in JetStream expires on the server's
// time. A replica woken after a suspension longer than its lease would
// believe it still held it. So the lease is held only while both the
// monotonic and the wall-clock readings are before the deadline's (see
// wallOf): a wall clock stepped back by NTP leaves the monotonic check;
// one stepped forward ends the lease early (safe: the next renewal moves
// it again).

// errLeasePassed is why a POST, an ack, a Nak or an InProgress was not
// sent (or a POST was cut): the lease deadline passed, or the lease was
// found taken.
var errLeasePassed = attempt.ErrLeasePassed

// errNotConnected is why an ack or InProgress was not sent.
var errNotConnected = attempt.ErrNotConnected

// leaseFence is a partition's lease deadline and what it allows: attempts,
// acks, Naks, InProgress and pulls only before it, and acks and InProgress
// only while the NATS connection is up.
type leaseFence struct {
	ctx   context.Context // the partition's: ends at release
	clock clockwork.Clock
	// connStatus is the NATS connection's status (nil: always connected).
	connStatus func() nats.Status

	// wallOf returns the wall-clock reading of a time read from clock
	// (nil: t.Round(0), which drops the monotonic reading; tests replace
	// it to suspend the wall clock apart from the fake one).
	wallOf func(t time.Time) time.Time

	mu       sync.Mutex
	deadline time.Time // no attempt starts after it (its monotonic reading decides)
	// wallDeadline is the deadline's wall-clock reading, fixed when the
	// deadline was set (zero: unset, taken from deadline).
	wallDeadline time.Time
	lost         bool // the lease was found taken: the deadline stays passed
	// posts are the cancels of the POSTs running inside the lease
	// (bound): lose ends them at once.
	posts  map[uint64]context.CancelCauseFunc
	postID uint64
}

// wall returns t's wall-clock reading.
func (lf *leaseFence) wall(t time.Time) time.Time {
	if lf.wallOf != nil {
		return lf.wallOf(t)
	}
	return t.Round(0)
}

// setDeadline moves the deadline to t (a lease renewal: its start on the
// engine's clock plus 3/4 of the TTL), on both of t's clocks.
func (lf *leaseFence) setDeadline(t time.Time) {
	lf.mu.Lock()
	if !lf.lost {
		lf.deadline, lf.wallDeadline = t, lf.wall(t)
	}
	lf.mu.Unlock()
}

// leftLocked returns the time left before the deadline on the clock that
// says less, and false once it passed on either (lf.mu held).
func (lf *leaseFence) leftLocked() (time.Duration, bool) {
	now := lf.clock.Now()
	wd := lf.wallDeadline
	if wd.IsZero() {
		wd = lf.wall(lf.deadline) // set at construction
	}
	left := min(lf.deadline.Sub(now), wd.Sub(lf.wall(now)))
	return left, !lf.lost && left > 0
}

// lose ends the lease at once: a renewal found the key taken (expired and
// claimed by another replica, or overwritten), so the deadline it set is
// no longer this replica's to use. From now on nothing is started, acked,
// Nak'd or kept alive (InProgress), and no late renewal can move the
// deadline again (setDeadline after lose is ignored): the new owner may
// have sent the event's successor already, and an ack or a POST now could
// come after it. Before, acks went on until the old deadline (up to 3/4
// of the lease TTL).
//
// A POST running (bound) is cancelled too: its answer is not waited for,
// and nothing is settled from it.
func (lf *leaseFence) lose() {
	lf.mu.Lock()
	lf.lost = true
	lf.deadline, lf.wallDeadline = time.Time{}, time.Time{}
	posts := lf.posts
	lf.posts = nil
	lf.mu.Unlock()
	for _, cancel := range posts {
		cancel(errLeasePassed)
	}
}

// mayStart reports whether an attempt may start: the partition was not
// released and its lease was renewed recently enough (a replica frozen
// past its deadline starts nothing more when it wakes up).
func (lf *leaseFence) mayStart() bool {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	_, held := lf.leftLocked()
	return lf.ctx.Err() == nil && held
}

// bound is where a POST of the partition passes the fence: right before
// it goes out, after everything that may wait before it (the slot, the
// throttle, the breaker, and the breaker's probe claim, up to 2 s against
// the shared state; see breaker/shared.go), so that no POST starts past
// the deadline whatever delayed it. It returns errLeasePassed when the
// deadline passed (or the partition was released), else ctx bounded by
// the lease: cancelled, with cause errLeasePassed, once the deadline
// passes without a renewal or the lease is lost. Renewals move the
// deadline, so a POST is cut only when its lease ends, not at the deadline
// it started under. The caller calls the returned cancel when the POST
// ended.
func (lf *leaseFence) bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	lf.mu.Lock()
	left, held := lf.leftLocked()
	if !held || lf.ctx.Err() != nil {
		lf.mu.Unlock()
		return nil, nil, errLeasePassed
	}
	pctx, cancel := context.WithCancelCause(ctx)
	if lf.posts == nil {
		lf.posts = map[uint64]context.CancelCauseFunc{}
	}
	lf.postID++
	id := lf.postID
	lf.posts[id] = cancel
	var t clockwork.Timer
	var check func()
	check = func() {
		lf.mu.Lock()
		defer lf.mu.Unlock()
		if _, running := lf.posts[id]; !running {
			return
		}
		left, held := lf.leftLocked()
		if !held {
			delete(lf.posts, id)
			cancel(errLeasePassed)
			return
		}
		t.Reset(left) // renewed meanwhile: wait for the new deadline
	}
	t = lf.clock.AfterFunc(left, check)
	lf.mu.Unlock()
	return pctx, func() {
		lf.mu.Lock()
		delete(lf.posts, id)
		t.Stop()
		lf.mu.Unlock()
		cancel(nil)
	}, nil
}

// waitLease waits while the lease deadline is passed (a renewal late, or a
// replica waking from a freeze) and reports whether the partition is still
// this replica's: false once it was released or its lease found lost. An
// event never gives way to its successor while it waits.
func (lf *leaseFence) waitLease() bool {
	for !lf.mayStart() {
		if lf.ctx.Err() != nil {
			return false
		}
		select {
		case <-lf.ctx.Done():
		case <-lf.clock.After(20 * time.Millisecond):
		}
	}
	return true
}

// leaseHeld reports whether the partition's lease deadline has not passed.
// A released partition keeps its lease (renewed) until its deliveries end.
func (lf *leaseFence) leaseHeld() bool {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	_, held := lf.leftLocked()
	return held
}

// connected reports whether the NATS connection is up right now.
func (lf *leaseFence) connected() bool {
	return lf.connStatus == nil || lf.connStatus() == nats.CONNECTED
}

// mayAck reports whether an ack, Nak or InProgress may be sent now: the
// lease is held and the connection is up; else the reason.
func (lf *leaseFence) mayAck() error {
	if !lf.leaseHeld() {
		return errLeasePassed
	}
	if !lf.connected() {
		return errNotConnected
	}
	return nil
}

// inProgress sends m's InProgress when mayAck allows it.
func (lf *leaseFence) inProgress(m jetstream.Msg) error {
	if err := lf.mayAck(); err != nil {
		return err
	}
	return m.InProgress()
}

// nak returns m to JetStream at once when mayAck allows it; else m goes
// back by AckWait.
func (lf *leaseFence) nak(log *slog.Logger, m jetstream.Msg) {
	if err := lf.mayAck(); err != nil {
		log.Debug("not Nak'd; it goes back by AckWait", slog.String("event_id", attempt.EventID(m)), slog.Any("reason", err))
		return
	}
	pull.Nak(log, m, 0)
}

// waitAck waits until an ack may be sent (mayAck) and reports true, or
// false once the partition was released (or its lease lost) with its lease
// deadline passed: nothing is acked after the deadline, and a renewal that
// comes late lets the ack go out then (the stream's next event waits for
// it, so it is not overtaken).
func (lf *leaseFence) waitAck() bool {
	for lf.mayAck() != nil {
		if lf.ctx.Err() != nil && !lf.leaseHeld() {
			return false
		}
		released := lf.ctx.Done()
		if lf.ctx.Err() != nil {
			released = nil // released already: acks go on while the lease holds
		}
		select {
		case <-released:
		case <-lf.clock.After(20 * time.Millisecond):
		}
	}
	return true
}

// beforeDeadline returns a context that ends at the lease deadline (on
// the engine's clock, as measured now) or after most, whichever comes
// first: a write that must not land once another owner may have read it
// (a stream's record set aside) gives up at the deadline.
func (lf *leaseFence) beforeDeadline(parent context.Context, most time.Duration) (context.Context, context.CancelFunc) {
	lf.mu.Lock()
	left, held := lf.leftLocked() // on the clock that says less
	lf.mu.Unlock()
	if !held {
		left = 0
	}
	return context.WithTimeout(parent, max(0, min(left, most)))
}
