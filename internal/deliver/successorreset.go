package deliver

// The successor check's way out when a stream waits for an event that
// JetStream will never deliver again (issue 31): resetForPredecessors.

import (
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// resetForPredecessors resets the partition consumer to its ack floor,
// as healFence does for the fence, when streams wait for a predecessor
// (a sequence JetStream named, above the ack floor) that is not pending
// on the consumer: info, read by the successor check, says every event
// pending on it is in hand (the lanes, the waiting events, the held ones,
// those being acked), and the consumer delivered past the lowest
// predecessor waited for. Such a predecessor is neither redelivered nor
// delivered for the first time: acked (a copy acked as settled before
// the stream's successor entry knew it), or dropped from the consumer's
// state by a consumer leader that took over with a state behind
// (docs/ordering.md, "A stream that waits for an event nobody brings").
// Before, the stream waited for it for ever, its later events filled
// MaxAckPending and the partition stopped: a soak run with the events
// stream's leader SIGKILLed every 8-12 s, after two fence resets,
// "ack_floor=33963 ... a stream's later events still wait for an earlier
// one to be redelivered" for minutes.
//
// The reset delivers every event above the floor again: a predecessor
// that was settled comes as a copy acked without a POST, which moves its
// stream on (successors.settledCopy); one never settled comes, passes the
// fence and goes first. What this owner settled above the floor counts
// as delivered (deliveredRecord.inherit), so none is sent twice. It is
// decided by the consumer's counts, not by a timeout; a reset is made at
// most once per fenceResetAfter AckWaits, so the events it brought back
// have come before the counts are read for another. It reports whether
// the consumer was reset (the partition then goes behind the fence).
func (pt *partition) resetForPredecessors(info *jetstream.ConsumerInfo) bool {
	// Below the floor, the successor check lets the stream go on; not
	// delivered yet, it comes in its turn.
	low := pt.succ.waitsFor(info.AckFloor.Stream, info.Delivered.Stream)
	if pt.reset == nil || low == 0 {
		return false
	}
	if !pt.predecessorReset.IsZero() && pt.clock.Since(pt.predecessorReset) < fenceResetAfter*pt.ackWait {
		return false
	}
	seqs := map[uint64]bool{}
	pt.book.pending(seqs)
	if pt.parking != nil {
		pt.parking.AddHeld(pt.holder, seqs)
	}
	_, waiting, acking, _ := pt.book.counts()
	if short := info.NumAckPending - len(seqs) - acking; short > 0 {
		// Something pending is not in hand: maybe the predecessor,
		// redelivered after AckWait (the fence's shortfall, healFence,
		// handles one that never is).
		return false
	}
	pt.log.Warn("a stream's later events wait for an earlier event that is not pending on the consumer (acked, or lost by a consumer leader); resetting the partition consumer to its ack floor",
		slog.Uint64("seq", low), slog.Int("num_ack_pending", info.NumAckPending), slog.Int("in_hand", len(seqs)),
		slog.Int("waiting", waiting), slog.Int("acking", acking),
		slog.Uint64("ack_floor_stream", info.AckFloor.Stream), slog.Uint64("delivered_stream", info.Delivered.Stream))
	pt.predecessorReset = pt.clock.Now()
	pt.record.inherit(pt.book.settledSeqs())
	through := pt.reset(pt.ctx)
	if through == 0 {
		return false
	}
	pt.hol.attempts.raiseResetThrough(through)
	if pt.fenceResets != nil {
		pt.fenceResets.Inc()
	}
	return true
}
