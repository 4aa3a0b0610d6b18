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

// wakeups are the channels Notifications hands out (LISTEN), shared with
// Claim (every open one is woken: the Store does not know which drain
// claimed). The trigger sends no notification for an append to a stream that
// was already pending (see migration 005), so if a claim passed over such
// a stream because its appender had not committed yet, nothing else may
// wake an idle drain once it has: the claim schedules a wake-up itself.
type wakeups struct {
	mu      sync.Mutex
	chs     map[chan struct{}]struct{} // the open Notifications channels
	pause   time.Duration              // the last pause; 0 after a claim that skipped nothing
	pending bool                       // a wake-up is scheduled
}

// open adds ch to the channels wake-ups go to.
func (w *wakeups) open(ch chan struct{}) {
	w.mu.Lock()
	if w.chs == nil {
		w.chs = make(map[chan struct{}]struct{})
	}
	w.chs[ch] = struct{}{}
	w.mu.Unlock()
}

// close closes ch, after which no wake-up is sent on it.
func (w *wakeups) close(ch chan struct{}) {
	w.mu.Lock()
	delete(w.chs, ch)
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
	if len(w.chs) == 0 || w.pending {
		return
	}
	w.pause = min(max(2*w.pause, skippedPauseMin), skippedPauseMax)
	w.pending = true
	time.AfterFunc(w.pause, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.pending = false
		for ch := range w.chs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	})
}
