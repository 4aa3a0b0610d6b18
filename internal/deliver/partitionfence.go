package deliver

// The partition's fence: whether every event pending on its consumer is
// in hand (fenceReady, handCount), and its way out when one never comes
// back (healFence).

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// handCount is how many distinct events of the partition are in hand and
// not settled nor being acked: in the fence, in the lanes, waiting for a
// predecessor (handBook.pending) or held behind a parked head; upTo of
// them at or below stream sequence through. The held ones are read
// last: an event moving from its lane to a parked stream meanwhile is
// seen in one or the other, never in neither. The split by place is for
// the fence's log (handSplit).
func (pt *partition) handCount(fence *fenceBuffer, through uint64) handSplit {
	var h handSplit
	seqs := map[uint64]bool{}
	fence.addSeqs(seqs)
	h.fence = len(seqs)
	h.lanes, h.waiting, h.acking, h.settled = pt.book.counts()
	pt.book.pending(seqs)
	before := len(seqs)
	pt.parking.AddHeld(pt.holder, seqs)
	h.held, h.total = len(seqs)-before, len(seqs)
	for s := range seqs {
		if s <= through {
			h.upTo++
		}
	}
	h.aside = pt.aside.asideCount()
	return h
}

// fenceTarget is what a partition's fence waits for: the events pending
// on its consumer when it was read (pending), every one delivered at or
// before delivery sequence delivered, so at or below stream sequence
// through. The fence passes once the run loop took every delivery up to
// delivered and has all of them in hand (handSplit.upTo). It does not
// compare the consumer's pending count with what is in hand at one
// instant: while the consumer keeps delivering (the partition pulls
// behind its fence, a backlog after a failover), what it delivered just
// before it was read is still on its way at every check, the hand is
// always short of it, and the fence waited until MaxAckPending or the
// end of the backlog stopped the flow, often past its reset bound
// (issue 31; docs/ordering.md, "A fence that waits for ever").
type fenceTarget struct {
	pending            int
	through, delivered uint64
	floor              uint64 // the consumer's ack floor (stream sequence)
	// settled is the partition's count of settled events then
	// (handBook.settledN): one settled since was pending and is not
	// missing.
	settled uint64
}

// targetOf is the fence's target as the consumer info says, when the
// partition had settled settled events.
func targetOf(info *jetstream.ConsumerInfo, settled uint64) *fenceTarget {
	return &fenceTarget{pending: info.NumAckPending, through: info.Delivered.Stream,
		delivered: info.Delivered.Consumer, floor: info.AckFloor.Stream, settled: settled}
}

// verdict reports whether the fence may pass against t, given what is in
// hand (h) and the delivery sequence of the last message the run loop
// took (received) and at the fence's previous check (seen). When it may
// not, short is how many of t's events are neither in hand, nor being
// acked, nor on their way: deliveries made before t was read that the
// run loop has not taken yet count as on their way only while the run
// loop is taking deliveries (received moved since seen); once nothing
// arrives any more, those are lost, and short. A delivery sequence that
// went back (a new consumer leader, a reset) takes every delivery as
// arrived.
func (t *fenceTarget) verdict(h handSplit, received, seen uint64) (pass bool, short int) {
	// Nothing pending: every delivery up to t.delivered was acked (a
	// former owner's, or this one's before a pause), and none of them
	// comes to this run loop again.
	arrived := received >= t.delivered || t.pending == 0
	have := h.upTo + int(h.settled-t.settled)
	if arrived && have >= t.pending {
		return true, 0
	}
	short = t.pending - have - h.acking
	if !arrived && received != seen {
		short -= int(t.delivered - received)
	}
	return false, short
}

// fenceResetAfter, in AckWaits, bounds how long a partition's fence waits
// for events pending on its consumer that are not in hand while their
// number does not fall (healFence). A delivery lost on its way comes back
// after one AckWait; a shortfall that stays three AckWaits is kept
// pending by something nobody controls any more (an InProgress of a
// delivery this replica no longer holds, a pending entry the server does
// not redeliver): see docs/ordering.md, "A fence that waits for ever".
const fenceResetAfter = 3

// healFence gets a fence that waits for events nobody brings back to a
// known state: it drops the fence's copies (not Nak'd: the reset delivers
// them again), makes what this owner settled count as delivered in its
// delivered record (deliveredRecord.inherit), and resets the partition
// consumer to its ack floor, as a take-over does: every event above the
// floor comes again at once, those settled are acked without a POST, the
// rest pass the fence in stream order. short is the shortfall (the
// events of the fence's target neither in hand, settled, being acked nor
// on their way, fenceTarget.verdict), stuck how long it has not fallen. It logs a WARN that says why and counts
// jsbridge_consumer_partition_fence_resets_total. The lanes keep their
// deliveries: their copies are dropped or acked as any redelivery's.
func (pt *partition) healFence(fence *fenceBuffer, info *jetstream.ConsumerInfo, h handSplit, short int, stuck time.Duration) {
	if pt.reset == nil {
		return
	}
	pt.log.Warn("partition fence reset: events pending on the consumer stayed out of hand and nobody brings them back; resetting the partition consumer to its ack floor",
		slog.Int("shortfall", short), slog.Duration("not_falling_for", stuck.Round(time.Second)),
		slog.Int("num_ack_pending", info.NumAckPending), slog.Int("in_hand", h.total), slog.Int("in_fence", h.fence),
		slog.Int("in_lanes", h.lanes), slog.Int("waiting", h.waiting), slog.Int("held", h.held), slog.Int("acking", h.acking),
		slog.Uint64("ack_floor_stream", info.AckFloor.Stream), slog.Uint64("delivered_stream", info.Delivered.Stream),
		slog.Int("num_waiting", info.NumWaiting), slog.Int("num_redelivered", info.NumRedelivered), slog.Duration("ack_wait", pt.ackWait))
	probe := &resetProbe{inHand: map[uint64]bool{}, through: info.Delivered.Stream}
	fence.addSeqs(probe.inHand)
	pt.book.pending(probe.inHand)
	pt.parking.AddHeld(pt.holder, probe.inHand)
	pt.record.inherit(pt.book.settledSeqs())
	through := pt.reset(pt.ctx)
	pt.fenceWait.shortfall(pt.clock.Now(), 0) // the next reset, if any, a bound later
	pt.target = nil                           // everything comes again: measured afresh
	if through == 0 {
		return // nothing pending any more, or the consumer could not be read: the fence checks again
	}
	pt.hol.attempts.raiseResetThrough(through)
	pt.probe = probe
	fence.take()
	if pt.fenceResets != nil {
		pt.fenceResets.Inc()
	}
}

// fenceReady reports whether the fence may pass: every event pending on
// the consumer when it was read (the fence's target, fenceTarget) is in
// hand (the fence, the lanes, held behind a parked head) once the run
// loop took everything the consumer had delivered then, and the park
// state was read afresh from the bucket (not the watch's cache). A target
// whose deliveries have all arrived without passing gives way to a fresh
// one at the next check. A fence that waits fenceWaitWarnEvery or longer
// logs a WARN, then again every fenceWaitWarnEvery, with the consumer's
// counts beside what is in hand. It returns the consumer's ack floor the
// target read (a sequence of the partitioned stream), which the
// successor check measures a stream's first event against.
func (pt *partition) fenceReady(fence *fenceBuffer) (floor uint64, ok bool) {
	if pt.fenceWait.since.IsZero() {
		pt.target = nil // a new wait: measured afresh
	}
	pt.fenceWait.start(pt.clock.Now())
	pt.ackSettledInFence(fence)
	if pt.fenceGauge != nil {
		pt.fenceGauge.Set(pt.clock.Since(pt.fenceWait.since).Seconds())
	}
	info, err := pt.cons.Info(pt.ctx)
	if err != nil {
		if waited, due := pt.fenceWait.due(pt.clock.Now()); due {
			pt.log.Warn("partition fence still waiting: reading the partition consumer fails", slog.Duration("waited", waited.Round(time.Second)), slog.Any("error", err))
		}
		return 0, false
	}
	pt.watch.floor.Store(info.AckFloor.Stream)
	if pt.target == nil || info.Delivered.Consumer < pt.target.delivered || info.NumAckPending == 0 {
		// None yet, or the consumer numbers its deliveries again from
		// lower (a new leader whose state lagged, a reset): a target in
		// the old numbering would wait for deliveries that never come.
		// Or nothing is pending any more (acked meanwhile, by a former
		// owner too): a target that waits for the deliveries made before
		// would wait for ever, with nothing short to heal.
		pt.target = targetOf(info, pt.book.settledCount())
	}
	t := pt.target
	h := pt.handCount(fence, t.through)
	pass, short := t.verdict(h, pt.received, pt.seen)
	if pt.received >= t.delivered && !pass {
		pt.target = targetOf(info, h.settled) // every delivery it waited for arrived: measure afresh
	}
	pt.seen = pt.received
	if !pass {
		if waited, due := pt.fenceWait.due(pt.clock.Now()); due {
			pt.logFenceWait(waited, info, h)
		}
		// The events being acked (their delivered record's write under
		// way, slow while the KV's leader moves) are pending and not in
		// hand, yet their ack comes: not part of what nobody brings back;
		// nor are the deliveries on their way.
		if stuck := pt.fenceWait.shortfall(pt.clock.Now(), short); pt.ackWait > 0 && stuck >= fenceResetAfter*pt.ackWait {
			pt.healFence(fence, info, h, short, stuck)
		}
		return 0, false
	}
	pt.fenceWait.shortfall(pt.clock.Now(), 0)
	if err := pt.parking.Reread(pt.ctx); err != nil {
		pt.log.Warn("re-reading the parked streams failed; the fence waits", slog.Any("error", err))
		return 0, false
	}
	if pt.aside != nil {
		if err := pt.aside.load(pt.ctx); err != nil {
			pt.log.Warn("reading the streams set aside failed; the fence waits", slog.Any("error", err))
			return 0, false
		}
	}
	pt.target = nil
	return t.floor, true
}

// ackSettledInFence acks the copies in the fence of events settled
// meanwhile and takes them out of it. A copy lands in the fence while its
// event is still in a lane (redelivered after a lease pause, in which no
// InProgress went out); the lane settles the event after. The fence does
// not count a settled event in hand (handBook.pending): when the lane's
// ack did not land (a consumer leader moving, the connection cut), the
// event stays pending on the consumer, and the copy, kept alive in the
// fence with InProgress (keepHeldAlive), never came back: the fence
// waited for it for ever. Acked here, or at worst (an ack not allowed
// now) dropped and left to come back after AckWait, it holds nothing.
func (pt *partition) ackSettledInFence(fence *fenceBuffer) {
	n := 0
	for _, m := range fence.snapshot() {
		if pt.ackSettledCopy(m) {
			fence.remove(m)
			n++
		}
	}
	if n > 0 {
		pt.log.Info("partition fence: copies of events settled meanwhile acked and taken out", slog.Int("events", n))
	}
}
