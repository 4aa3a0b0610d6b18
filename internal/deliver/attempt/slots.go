package attempt

import (
	"container/heap"
	"context"
	"sync"
)

// slots is one subscription's POST slots on the replica (MaxInFlight of
// them, every partition drawing from them), given oldest event first:
// when all are taken, the next one freed goes to the waiting attempt
// whose event has the lowest sequence in the events stream, not to the
// one that asked first. An ordered stream sends one event at a time, so
// each of its events would otherwise queue for a slot behind every
// event that arrived meanwhile on other streams: with the slots busy, a
// hot stream's events each waited a full queue (issue 33: at 2,000
// events/s, 128 ms of a lane's ~200 ms turn) and it fell behind while
// the unordered subscription, which waits once per event, kept up.
// Oldest first gives a stream's waiting head the next slot, and keeps
// an unordered subscription's order of service what it was (the reader
// hands events on in sequence order).
type slots struct {
	mu    sync.Mutex
	limit int
	taken int
	queue waiters
}

func newSlots(limit int) *slots { return &slots{limit: limit} }

// waiter is an attempt waiting for a slot: seq is its event's sequence;
// ready is closed when the slot is handed to it (given).
type waiter struct {
	seq   uint64
	ready chan struct{}
	given bool
	at    int // its index in the queue
}

// acquire waits for a slot for the event at seq and reports whether it
// got one (false: ctx ended first, nothing taken).
func (s *slots) acquire(ctx context.Context, seq uint64) bool {
	s.mu.Lock()
	if s.taken < s.limit {
		s.taken++
		s.mu.Unlock()
		return true
	}
	w := &waiter{seq: seq, ready: make(chan struct{})}
	heap.Push(&s.queue, w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.given { // handed over as ctx ended: pass it on
		s.mu.Unlock()
		s.release()
		return false
	}
	heap.Remove(&s.queue, w.at)
	s.mu.Unlock()
	return false
}

// release frees a slot: it goes to the oldest waiter, if any.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queue.Len() == 0 {
		s.taken--
		return
	}
	w := heap.Pop(&s.queue).(*waiter)
	w.given = true
	close(w.ready)
}

// inFlight returns the slots taken.
func (s *slots) inFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken
}

// waiters is a min-heap of waiters by sequence (container/heap).
type waiters []*waiter

func (q waiters) Len() int           { return len(q) }
func (q waiters) Less(i, j int) bool { return q[i].seq < q[j].seq }
func (q waiters) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].at, q[j].at = i, j
}
func (q *waiters) Push(x any) {
	w := x.(*waiter)
	w.at = len(*q)
	*q = append(*q, w)
}
func (q *waiters) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return w
}
