package deliver

import (
	"sync"
	"sync/atomic"
)

// handGate counts the events in the lanes of all of an ordered
// subscription's partitions on this replica against the hand limit
// (orderedRunner.handLimit), and tells a partition waiting at the limit
// when there is room again: it resumes pulling at once, not at its next
// poll (it polled every 5 ms, against POSTs of a few ms).
type handGate struct {
	n     atomic.Int64
	limit int64

	mu   sync.Mutex
	room chan struct{} // closed when n drops below limit; nil when nobody waits
}

// newHandGate returns a gate with the given limit; limit 0 means no limit.
func newHandGate(limit int64) *handGate { return &handGate{limit: limit} }

// full reports whether the events in hand are at the limit or over.
func (g *handGate) full() bool { return g.limit > 0 && g.n.Load() >= g.limit }

// enter counts one more event in hand.
func (g *handGate) enter() { g.n.Add(1) }

// leave counts one event fewer in hand, waking the partitions waiting
// for room when that brings the count below the limit.
func (g *handGate) leave() {
	if g.n.Add(-1) != g.limit-1 {
		return
	}
	g.mu.Lock()
	if g.room != nil {
		close(g.room)
		g.room = nil
	}
	g.mu.Unlock()
}

// roomMade returns a channel closed once the count drops below the limit
// (at once when it already is). A wake-up can be spurious: the caller
// checks full again.
func (g *handGate) roomMade() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.full() {
		return closedChan
	}
	if g.room == nil {
		g.room = make(chan struct{})
	}
	return g.room
}

// closedChan is a closed channel: a wait on it ends at once.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
