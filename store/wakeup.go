package store

import (
	"sync"
	"time"
)

// Pauses before the drain is woken to look again after a claim passed over
// a due stream that an uncommitted appender held: from 1ms, doubling while
// claim after claim finds one held (a long application transaction), up to
// 100ms.
const (
	skippedPauseMin = time.Millisecond
	skippedPauseMax = 100 * time.Millisecond
)

// wakeups is the channel Notifications hands out (LISTEN), shared with
// Claim. The trigger sends no notification for an append to a stream that
// was already pending (see migration 005), so if a claim passed over such
// a stream because its appender had not committed yet, nothing else may
// wake an idle drain once it has: the claim schedules a wake-up itself.
type wakeups struct {
	mu      sync.Mutex
	ch      chan struct{} // nil when no Notifications channel is open
	pause   time.Duration // the last pause; 0 after a claim that skipped nothing
	pending bool          // a wake-up is scheduled
}

// open makes ch the channel wake-ups go to.
func (w *wakeups) open(ch chan struct{}) {
	w.mu.Lock()
	w.ch = ch
	w.mu.Unlock()
}

// close closes ch, after which no wake-up is sent on it.
func (w *wakeups) close(ch chan struct{}) {
	w.mu.Lock()
	if w.ch == ch {
		w.ch = nil
	}
	w.mu.Unlock()
	close(ch)
}

// skipped records a claim's outcome: when it passed over a due stream an
// appender held, the drain is woken after a pause (one wake-up at a time).
func (w *wakeups) skipped(yes bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !yes {
		w.pause = 0
		return
	}
	if w.ch == nil || w.pending {
		return
	}
	w.pause = min(max(2*w.pause, skippedPauseMin), skippedPauseMax)
	w.pending = true
	time.AfterFunc(w.pause, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.pending = false
		if w.ch != nil {
			select {
			case w.ch <- struct{}{}:
			default:
			}
		}
	})
}
