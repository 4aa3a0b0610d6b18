package deliver

import (
	"sync"
	"sync/atomic"
	"time"
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

// A stream whose head is retried in place (a 5xx, a timeout, a throttle,
// or the receiver's order gate answering gap or in-progress) cannot send
// its later events, and every one of them in hand counts against the
// subscription's hand limit: a stuck stream with enough events behind it
// filled the limit, and every partition of the subscription on the
// replica stopped pulling, its other streams with it. blockedStreams
// keeps at most blockedKeep events of a blocked stream in hand (its head
// and the ones queued behind it); the later ones are Nak'd (no attempt
// counted: attempts count POSTs) and come back from JetStream after a
// delay that grows with the time the head has been blocked, up to
// blockedNakMax, to be handed on once the head settled.
//
// Order: a Nak'd event is Nak'd before the successor check (successors)
// sees it, so the stream's last event handed on stays the one before it;
// while the head stays blocked every later event of the stream is Nak'd
// too (dropping), and once it settled, an event that comes back before
// its Nak'd predecessor waits for it (successors.handOn). JetStream's
// MaxAckPending still counts Nak'd events: a stream stuck with more than
// MaxAckPending events behind it stops its own partition's reads (not the
// other partitions'); OrderStuckAfter parks it before that lasts.
type blockedStreams struct {
	// changed is signalled when a stream becomes blocked: the run loop
	// then trims its lane (partition.trimBlocked).
	changed chan struct{}

	mu       sync.Mutex
	since    map[string]time.Time // stream key → when its head was first retried in place
	dropping map[string]bool      // stream key → an event of it was Nak'd while blocked
	trimmed  map[string]bool      // stream key → its lane was trimmed while blocked
}

// blockedKeep is how many events of a blocked stream stay in hand: its
// head and the next ones, ready to go once it settles.
const blockedKeep = 4

// blockedNakMin and blockedNakMax bound the delay of a blocked stream's
// dropped events: the time its head has been blocked, within these.
const (
	blockedNakMin = 250 * time.Millisecond
	blockedNakMax = 10 * time.Second
)

func newBlockedStreams() *blockedStreams {
	return &blockedStreams{since: map[string]time.Time{}, dropping: map[string]bool{}, trimmed: map[string]bool{}, changed: make(chan struct{}, 1)}
}

// block records that stream key's head is being retried in place, since
// now unless it was already.
func (b *blockedStreams) block(key string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.since[key]; ok {
		return
	}
	b.since[key] = now
	select {
	case b.changed <- struct{}{}:
	default: // a trim is due already
	}
}

// startDropping marks every blocked stream whose lane was not trimmed yet
// as trimmed and dropping, and returns their keys, with the delay of
// their dropped events (see drop).
func (b *blockedStreams) startDropping(now time.Time) map[string]time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]time.Duration{}
	for key, since := range b.since {
		if !b.trimmed[key] {
			b.trimmed[key], b.dropping[key] = true, true
			out[key] = nakDelay(now, since)
		}
	}
	return out
}

// nakDelay is the delay of a dropped event of a stream blocked since.
func nakDelay(now, since time.Time) time.Duration {
	return min(max(now.Sub(since), blockedNakMin), blockedNakMax)
}

// unblock records that stream key's head settled (or left its lane).
func (b *blockedStreams) unblock(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.since, key)
	delete(b.dropping, key)
	delete(b.trimmed, key)
}

// drop reports whether an event of stream key, with inLane events of the
// stream in its lane already, is to be Nak'd rather than handed on, and
// after what delay: when the stream's head is blocked and its lane holds
// blockedKeep events, or an event of it was dropped already while the
// head stays blocked.
func (b *blockedStreams) drop(key string, inLane int, now time.Time) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	since, blocked := b.since[key]
	if !blocked || (!b.dropping[key] && inLane < blockedKeep) {
		return 0, false
	}
	b.dropping[key] = true
	return nakDelay(now, since), true
}
