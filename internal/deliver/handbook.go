package deliver

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// handBook is what a partition has in hand and what it settled, under one
// lock: the fence counts it (count) while the lanes, the acks and the run
// loop change it. Its invariants: a sequence is in inLane from its
// submission to a lane until it left it; in acking while it is being
// settled (the delivered record written, then the ack sent); in recent
// (and lastDone moved on) once the record holds it, before it leaves
// acking, so that the fence never sees a settled event as neither in hand
// nor settled. A copy of a recent event is acked when it comes back
// (partition.ackSettledCopy), so one whose ack did not land does not hold
// the fence.
type handBook struct {
	mu       sync.Mutex
	lastDone map[string]uint64 // stream key → sequence of the last event settled
	recent   map[uint64]bool   // the recently settled sequences (at most settledKept)
	recentQ  []uint64          // recent's sequences, oldest first
	inLane   map[uint64]bool   // sequences submitted to a lane and not left it
	acking   map[uint64]bool   // sequences whose ack was sent and not confirmed yet
	// settledN counts the sequences settled (recorded in recent), for
	// the fence: an event pending when it read the consumer and settled
	// since is not missing (fenceTarget).
	settledN uint64
	// waiting holds, by stream key, events that arrived while an earlier
	// event of their stream that the partition consumer delivers was not
	// handed on yet (lost on its way, to be redelivered), in stream order.
	// Only the run loop changes it.
	waiting map[string][]waitingMsg
}

// waitingMsg is an event waiting for an earlier event of its stream, and
// since when.
type waitingMsg struct {
	msg   jetstream.Msg
	since time.Time
}

// settledKept bounds the settled sequences a partition remembers to
// recognise a late copy of an event it already settled.
const settledKept = 16384

func newHandBook() *handBook {
	return &handBook{
		lastDone: map[string]uint64{}, recent: map[uint64]bool{}, inLane: map[uint64]bool{}, acking: map[uint64]bool{},
		waiting: map[string][]waitingMsg{},
	}
}

// settledBefore reports whether an event of stream key at seq comes at or
// before the stream's last settled one (behind), and whether it was
// settled itself recently (stale: a copy that raced its own ack).
func (b *handBook) settledBefore(key string, seq uint64) (behind, stale bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	behind = seq != 0 && seq <= b.lastDone[key]
	return behind, behind && b.recent[seq]
}

// enterLane records seq as submitted to a lane and reports true, or false
// when it is in a lane already (a redelivered copy). Sequence 0 (no
// metadata) is never recorded.
func (b *handBook) enterLane(seq uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inLane[seq] {
		return false
	}
	if seq != 0 {
		b.inLane[seq] = true
	}
	return true
}

// leftLane records that the event at seq left its lane.
func (b *handBook) leftLane(seq uint64) {
	b.mu.Lock()
	delete(b.inLane, seq)
	b.mu.Unlock()
}

// acked records that seq's ack is being sent (on) or no longer (off).
func (b *handBook) acked(seq uint64, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if on {
		b.acking[seq] = true
	} else {
		delete(b.acking, seq)
	}
}

// settled records that the event at seq of stream key was acked or
// dead-lettered.
func (b *handBook) settled(key string, seq uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if seq > b.lastDone[key] {
		b.lastDone[key] = seq
	}
	if !b.recent[seq] {
		b.settledN++
		b.recent[seq] = true
		b.recentQ = append(b.recentQ, seq)
		if len(b.recentQ) > settledKept {
			delete(b.recent, b.recentQ[0])
			b.recentQ = b.recentQ[1:]
		}
	}
}

// wait keeps m of stream key, since now, until its predecessor was handed
// on, one copy per sequence (the latest, whose ack counts).
func (b *handBook) wait(key string, m jetstream.Msg, now time.Time) {
	seq := streamSeq(m)
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiting[key]
	i, found := slices.BinarySearchFunc(w, seq, func(x waitingMsg, s uint64) int { return cmp.Compare(streamSeq(x.msg), s) })
	if found {
		w[i].msg = m
		return
	}
	b.waiting[key] = slices.Insert(w, i, waitingMsg{msg: m, since: now})
}

// firstWaiting returns the first waiting event of stream key (nil: none)
// and how many wait.
func (b *handBook) firstWaiting(key string) (jetstream.Msg, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiting[key]
	if len(w) == 0 {
		return nil, 0
	}
	return w[0].msg, len(w)
}

// popWaiting removes the first waiting event of stream key.
func (b *handBook) popWaiting(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiting[key]; len(w) <= 1 {
		delete(b.waiting, key)
	} else {
		b.waiting[key] = w[1:]
	}
}

// waitingSince returns the stream keys whose first waiting event waits
// since before limit.
func (b *handBook) waitingSince(limit time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var keys []string
	for key, w := range b.waiting {
		if len(w) > 0 && w[0].since.Before(limit) {
			keys = append(keys, key)
		}
	}
	return keys
}

// waitingMsgs returns the events waiting for a predecessor.
func (b *handBook) waitingMsgs() []jetstream.Msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []jetstream.Msg
	for _, w := range b.waiting {
		for _, x := range w {
			out = append(out, x.msg)
		}
	}
	return out
}

// takeWaiting empties the waiting events and returns them.
func (b *handBook) takeWaiting() []jetstream.Msg {
	out := b.waitingMsgs()
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.waiting)
	return out
}

// pending adds to seqs (the fence's) the events in the lanes and those
// waiting for a predecessor, then removes those settled or being acked:
// what of the partition is in hand and pending on its consumer, each
// counted once (a redelivered copy of an event still in its lane waits in
// the fence too, and counting it twice would let the fence pass while a
// lost delivery is still on its way, to be sent after its successors).
func (b *handBook) pending(seqs map[uint64]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.inLane {
		seqs[s] = true
	}
	for _, w := range b.waiting {
		for _, x := range w {
			seqs[streamSeq(x.msg)] = true
		}
	}
	for s := range seqs {
		if b.recent[s] || b.acking[s] {
			// Acked, or maybe: an ack whose answer was lost may be
			// recorded already, and counting its event as pending
			// would hide a lost delivery. Not counted, it makes the
			// fence wait for the ack at worst.
			delete(seqs, s)
		}
	}
}

// waitingOf returns how many events of stream key wait for a predecessor.
func (b *handBook) waitingOf(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting[key])
}

// takeWaitingOf removes the waiting events of stream key and returns
// them, in stream order.
func (b *handBook) takeWaitingOf(key string) []jetstream.Msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []jetstream.Msg
	for _, x := range b.waiting[key] {
		out = append(out, x.msg)
	}
	delete(b.waiting, key)
	return out
}

// inHand returns how many events are in the lanes or wait for a
// predecessor.
func (b *handBook) inHand() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.inLane)
	for _, w := range b.waiting {
		n += len(w)
	}
	return n
}

// lastSettled returns the sequence of stream key's last event settled
// here (0: none).
func (b *handBook) lastSettled(key string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastDone[key]
}

// settledSeqs returns, by stream key, the sequence of the last event
// settled (written in the delivered record, when there is one).
func (b *handBook) settledSeqs() map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.lastDone)
}

// counts returns how many sequences are in the lanes, waiting for a
// predecessor and being acked, raw (a sequence may be in two of them),
// and how many were settled so far (settledN). Being acked counts those
// whose delivered record's write is under way, not those settled already
// and whose ack is being sent.
func (b *handBook) counts() (inLane, waiting, acking int, settled uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.waiting {
		waiting += len(w)
	}
	for s := range b.acking {
		if !b.recent[s] {
			acking++
		}
	}
	return len(b.inLane), waiting, acking, b.settledN
}

// asideCount is how many streams are set aside on the partition (0 for a
// nil asides).
func (as *asides) asideCount() int {
	if as == nil {
		return 0
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	return len(as.streams)
}

// settledCount returns how many events were settled so far (settledN).
func (b *handBook) settledCount() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.settledN
}
