package deliver

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
	"github.com/jsbridge/jsbridge/wire"
)

// partition is one owned partition of an ordered subscription: its pull
// loop and its lanes. Its rooms, each with its own state: the lease fence
// (lease), what it has in hand and settled (book), the successor check
// (succ), the head-of-line delivery (hol) and the consumer watch (watch).
type partition struct {
	// inHand counts the events in the lanes of all the subscription's
	// partitions on this replica; the partition pulls no more while it is
	// at its limit (orderedRunner.handLimit).
	inHand    *handGate
	pullBatch int // the client's pull buffer (orderedRunner.pullBatch)
	p         int
	cons      jetstream.Consumer
	parking   *park.Parking // the subscription's parked streams
	ackWait   time.Duration // the subscription's AckWait
	clock     clockwork.Clock
	log       *slog.Logger

	rev  uint64 // lease revision; the ownership loop's alone
	lost bool   // the lease is someone else's; the ownership loop's alone

	ctx    context.Context // ends at release
	cancel context.CancelFunc
	done   chan struct{} // closed when every delivery of the partition ended

	lanes  lanes // one per stream
	lease  *leaseFence
	book   *handBook
	succ   *successors // the run loop's alone
	hol    *headOfLine
	watch  *consumerWatch
	record *deliveredRecord // nil: none (tests without JetStream)
	holder *park.Holder     // the partition as its parked streams' events see it
	aside  *asides          // its streams set aside (aside.go); nil: none ever is
	// asideFloorRead is the consumer's ack floor as the streams set aside
	// last read it, at asideFloorAt (partition.asideFloor); the run
	// loop's alone.
	asideFloorAt   time.Time
	asideFloorRead uint64
	// maxAckPending is the partition consumer's MaxAckPending (0:
	// unknown): half of it in hand sets a stuck stream aside at once.
	maxAckPending int
	// fenceWait is how long the fence has waited (logged past
	// fenceWaitWarnEvery); the run loop's alone.
	fenceWait fenceWait
	// probe names the events a fence reset brought back that were not
	// in hand (healFence); the run loop's alone; nil: no reset pending.
	probe *resetProbe
	// received is the delivery sequence of the last message the run loop
	// took from the pull (0: none yet); the run loop's alone. A jump past
	// received+1 means a delivery never arrived (a server that died while
	// sending it): it comes back after AckWait, and until then nothing
	// newer of the partition may go out (the fence again). A sequence at
	// or below it means a new consumer leader whose replicated state
	// lagged behind the old one's: it numbers its deliveries again from
	// where its state ends, so a later jump would hide below received;
	// the partition goes behind the fence too, and follows the new
	// leader's numbering from there. The fence also reads it: what the
	// consumer delivered up to its Delivered.Consumer and the run loop
	// has not taken yet is on its way (fenceTarget).
	received uint64
	// target is what the fence waits for (fenceTarget), seen is received
	// at the fence's last check; the run loop's alone. Nil: none yet.
	target *fenceTarget
	seen   uint64
	// fenceGauge is the partition's
	// jsbridge_consumer_partition_fence_waiting_seconds, dropFenceGauge
	// deletes it at the end; nil: not exported.
	fenceGauge     prometheus.Gauge
	dropFenceGauge func()
	// reset resets the partition consumer to its ack floor
	// (orderedRunner.resetToAckFloor) when the fence waits for events
	// nobody brings back (healFence); fenceResets counts it. Nil: never.
	reset       func(context.Context) uint64
	fenceResets prometheus.Counter
	// predecessorReset is when resetForPredecessors last reset the
	// partition consumer; the run loop's alone.
	predecessorReset time.Time

	health *health.State // the subscriptions' disabled state (nil: enabled)
	sub    string        // the subscription's name
}

// partitionDeps is what a partition is made of beside its own number,
// consumer, lease and context (see newPartition).
type partitionDeps struct {
	inHand       *handGate // nil: no limit
	pullBatch    int
	r            *runner
	parking      *park.Parking
	clock        clockwork.Clock
	log          *slog.Logger // the subscription's
	eventsPrefix string
	filters      []string // the partition consumer's filter subjects
	attempts     failedAttempts
	checkEvery   time.Duration // how often the consumer watch reads the consumer
	connStatus   func() nats.Status
	slots        chan struct{}
	copyStream   func(context.Context) (jetstream.Stream, error)
	// record is the partition's delivered record, claimed (nil: none,
	// every event is acked at once).
	record *deliveredRecord
	// sendAck sends an ack behind the record (nil: the message's Ack).
	sendAck func(jetstream.Msg) error
	// epoch is the claim's lease epoch (owner.Epochs.Next), every
	// webhook's Jsbridge-Lease-Epoch; epochs raises the counter after a
	// stale-epoch answer.
	epoch  uint64
	epochs owner.Epochs
	// stuckAfter is Config.OrderStuckAfter (0: never).
	stuckAfter time.Duration
	// chain is where the partition's version chain looks up a stream's
	// predecessor (chain.go); skipped records a dead-lettered version
	// (headOfLine.skipped). Nil: every webhook names none.
	chain   func(ctx context.Context, key string, seq uint64) (int64, error)
	skipped func(ctx context.Context, streamKey string, version, previous int64) error
	// parks is the park bucket, where a stream set aside is recorded
	// (aside.go); nil: no stream is set aside.
	parks jetstream.KeyValue
	// reset resets the partition consumer to its ack floor and returns
	// the last stream sequence it had delivered (0: not reset), for the
	// fence's way out (partition.healFence); nil: never reset.
	reset func(context.Context) uint64
}

// newPartition makes partition p, read from cons, whose lease (created at
// KV revision rev) holds until deadline.
func newPartition(d partitionDeps, p int, cons jetstream.Consumer, rev uint64, deadline time.Time) *partition {
	ctx, cancel := context.WithCancel(context.Background())
	log := d.log.With(slog.Int("partition", p))
	if d.inHand == nil {
		d.inHand = newHandGate(0)
	}
	var ackWait time.Duration
	if d.r != nil {
		ackWait = d.r.sub.AckWait
	}
	pt := &partition{
		inHand: d.inHand, pullBatch: d.pullBatch, p: p, cons: cons, parking: d.parking, ackWait: ackWait, clock: d.clock, log: log,
		rev: rev, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		lease: &leaseFence{Fence: owner.NewFence(ctx, d.clock, deadline), clock: d.clock, connStatus: d.connStatus},
		book:  newHandBook(),
	}
	if d.r != nil {
		pt.health, pt.sub, pt.maxAckPending = d.r.health, d.r.sub.Name, d.r.sub.MaxAckPending
	}
	pt.record, pt.reset = d.record, d.reset
	pt.succ = newSuccessors(ctx, d.clock, log, pt.book, cons, d.filters, d.copyStream, pt.record.inheritedSeq)
	if d.r != nil {
		pt.succ.js = d.r.js
	}
	pt.holder = &park.Holder{
		P:          p,
		Ack:        func(m jetstream.Msg) { pt.hol.ack(m, func() *slog.Logger { return log }) },
		InProgress: pt.lease.inProgress,
		Nak:        func(m jetstream.Msg) { pt.lease.nak(log, m) },
	}
	if d.r != nil && d.r.metrics != nil {
		vec, labels := d.r.metrics.fenceWaiting, []string{d.r.sub.Name, strconv.Itoa(p)}
		pt.fenceGauge, pt.dropFenceGauge = vec.WithLabelValues(labels...), func() { vec.DeleteLabelValues(labels...) }
		pt.fenceResets = d.r.metrics.fenceResets.WithLabelValues(d.r.sub.Name)
	}
	if d.parks != nil && d.r != nil {
		pt.aside = newAsides(d.parks, d.r.sub.Name, p, d.r.replicaID, d.clock, log, d.copyStream, d.filters)
		if d.r.metrics != nil {
			pt.aside.gauge = d.r.metrics.streamsAside.WithLabelValues(d.r.sub.Name)
			pt.aside.stuckGauge, pt.aside.stuckAfter = d.r.metrics.asideStuck.WithLabelValues(d.r.sub.Name), d.stuckAfter
		}
	}
	pt.hol = &headOfLine{
		ctx: ctx, release: cancel, clock: d.clock, log: log, r: d.r, lease: pt.lease, book: pt.book, parking: d.parking, holder: pt.holder,
		attempts: d.attempts, slots: d.slots, eventsPrefix: d.eventsPrefix, p: p, epoch: d.epoch, epochs: d.epochs, stuckAfter: d.stuckAfter,
		chain: newChain(d.chain), skipped: d.skipped, aside: pt.aside, record: d.record, sendAck: d.sendAck,
	}
	durable := ""
	if d.r != nil {
		durable = wire.PartitionDurable(d.r.sub.Name, p)
	}
	pt.watch = &consumerWatch{
		cons: cons, durable: durable, every: d.checkEvery, clock: d.clock, log: log, filters: d.filters, copyStream: d.copyStream, release: cancel,
	}
	if pt.record != nil {
		pt.record.floor = pt.watch.floor.Load
		pt.record.lost = func() { pt.lease.Lose(); pt.release() }
	}
	return pt
}

func (pt *partition) release() { pt.cancel() }

func (pt *partition) finished() bool {
	select {
	case <-pt.done:
		return true
	default:
		return false
	}
}

// fenceCheck is how often a new owner compares the partition consumer's
// pending count with the messages in its hands.
const fenceCheck = 200 * time.Millisecond

// run pulls the partition until it is released: first the fence (nothing
// is delivered until every message pending on the consumer is in hand,
// then they go to the lanes in stream order), then each message to its
// stream's lane. At the end it returns what it holds to JetStream and
// waits for the deliveries running.
func (pt *partition) run() {
	var wg sync.WaitGroup
	defer close(pt.done)
	defer pt.aside.released()
	if pt.dropFenceGauge != nil {
		defer pt.dropFenceGauge()
	}
	// The record's last write, once every delivery ended: what they
	// settled is written before the partition is handed over.
	recordStop, recordDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(recordDone); pt.record.run(pt.lease, recordStop) }()
	defer func() { close(recordStop); <-recordDone }()
	defer wg.Wait()
	iter := pt.openPull()
	if iter == nil {
		return
	}
	stopReading := make(chan struct{})
	defer func() {
		if stopReading != nil {
			close(stopReading)
		}
	}()
	pulled := pt.read(iter, stopReading)
	kctx, stopKeep := context.WithCancel(context.Background())
	defer stopKeep()
	var fence fenceBuffer
	// What the partition holds without delivering it: the fence, the
	// events queued behind their stream's running delivery and those
	// waiting for an earlier event of their stream.
	go keepHeldAlive(kctx, pt.clock, pt.ackWait, pt.log, func() []jetstream.Msg {
		if pt.lease.mayAck() != nil {
			return nil // past the lease deadline, or disconnected: no InProgress
		}
		return append(append(fence.snapshot(), pt.lanes.queued()...), pt.book.waitingMsgs()...)
	})
	go pt.watch.watchConsumer(kctx)

	fencing := true
	var lastCheck time.Time
	var lastUnstick time.Time
	for pt.ctx.Err() == nil {
		healthChanged := pt.health.Changes()
		if held, disabled := pt.lease.Held(), pt.health.IsDisabled(pt.sub); !held || disabled {
			// Past the lease deadline: pull nothing until a renewal;
			// disabled: nothing until enabled (the heads in hand wait
			// unsent). What was pulled and not delivered yet is pending
			// on the consumer: behind the fence again until it is back.
			if !held {
				iter = pt.pausePull(iter, stopReading)
			} else {
				iter = pt.pauseDisabled(iter, pulled, stopReading)
			}
			if iter == nil {
				stopReading = nil
				break
			}
			stopReading = make(chan struct{})
			pulled = pt.read(iter, stopReading)
			fencing = true
			lastCheck = pt.clock.Now()
			continue
		}
		if !fencing && pt.inHand.full() {
			// Enough events in the lanes: pull no more for now (what
			// waits in JetStream needs no InProgress). Resume when a lane
			// makes room, or after 5 ms to release unparked events and
			// check the lease.
			for _, m := range pt.parking.ReleaseFor(pt.holder) {
				pt.dispatch(m, &wg)
			}
			pt.tendAside(&wg)
			select {
			case <-pt.ctx.Done():
			case <-pt.inHand.roomMade():
			case <-pt.clock.After(5 * time.Millisecond):
			}
			continue
		}
		var msg jetstream.Msg
		var err error
		select {
		case p := <-pulled:
			msg, err = p.msg, p.err
			if msg != nil {
				msg = pull.ParsedOnce(msg)
			}
		case c := <-pt.succ.checks:
			pt.succ.answered(c)
			pt.dispatchWaiting(c.key, &wg)
			continue
		case <-pt.clock.After(fenceCheck):
			err = nats.ErrTimeout
		case <-pt.ctx.Done():
			continue
		case <-healthChanged:
			continue
		}
		if !fencing {
			// Events of unparked streams go first, before a newer one
			// of theirs just pulled.
			for _, m := range pt.parking.ReleaseFor(pt.holder) {
				pt.dispatch(m, &wg)
			}
		}
		if err == nil {
			pt.probe.saw(msg, pt.book)
			pt.watch.pulled.Add(1)
			c := consumerSeq(msg)
			if !fencing && pt.deliveryGap(pt.received, c) {
				fencing = true
				lastCheck = pt.clock.Now()
			}
			if c != 0 {
				pt.received = c
			}
		}
		switch {
		case err == nil && pt.ackSettledCopy(msg):
			// Its ack was not sent or did not land: it came back. Acked
			// here even behind the fence, which does not count it in hand
			// and would wait for it for ever.
		case err == nil && fencing:
			fence.add(msg)
		case err == nil:
			pt.dispatch(msg, &wg)
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			// The pull found the consumer gone: released at once, as the
			// consumer watch does (which reads a quiet partition's
			// consumer only every quietReads ticks); the ownership loop
			// makes it again and claims the partition anew.
			pt.log.Warn("the partition consumer no longer exists; releasing the partition to create it again", slog.Any("error", err))
			pt.release()
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			pt.log.Warn("partition pull ended; restarting it")
			iter, err = pt.cons.Messages(partitionPullOpts(pt.pullBatch)...)
			if err != nil {
				sleep(pt.ctx, pt.clock, time.Second)
				iter = nil
			} else {
				pulled = pt.read(iter, stopReading)
			}
		}
		if iter == nil {
			break
		}
		for _, key := range pt.succ.takeMoved() {
			pt.dispatchWaiting(key, &wg)
		}
		if !fencing {
			pt.tendAside(&wg)
		}
		if !fencing && pt.clock.Since(lastUnstick) >= unstickAfter {
			lastUnstick = pt.clock.Now()
			goOn, still := pt.succ.unstick()
			for _, key := range goOn {
				pt.dispatchWaiting(key, &wg)
			}
			if still != nil && pt.resetForPredecessors(still) {
				// Behind the fence until every pending event is in hand
				// again, as after a take-over.
				fencing = true
				lastCheck = pt.clock.Now()
			}
		}
		if fencing && pt.clock.Since(lastCheck) >= fenceCheck {
			lastCheck = pt.clock.Now()
			if floor, ok := pt.fenceReady(&fence); ok {
				fencing = false
				pt.succ.fencePassed(floor)
				msgs := fence.take()
				// Logged with no events too: a pass that released nothing
				// tells a stall's reader the fence was not what held it.
				pt.log.Info("partition fence passed: every pending event is in hand", slog.Int("events", len(msgs)),
					slog.Duration("waited", pt.fenceWait.passed(pt.clock.Now()).Round(time.Millisecond)))
				pt.probe.report(pt.log)
				pt.probe = nil
				if pt.fenceGauge != nil {
					pt.fenceGauge.Set(0)
				}
				for _, m := range msgs {
					pt.dispatch(m, &wg)
				}
			}
		}
	}
	if iter != nil {
		pt.stopPull(iter, pulled)
	}
	for _, m := range append(fence.take(), pt.book.takeWaiting()...) {
		pt.lease.nak(pt.log, m)
	}
	pt.parking.ReturnHeld(pt.holder)
}

// deliveryGap reports whether delivery sequence c, received after last
// (0: none yet), says a delivery never arrived (a jump past last+1: it
// comes back after AckWait) or went back (a new consumer leader whose
// replicated state lags numbers its deliveries again from where its state
// ends, so a later jump would hide below last); either way the partition
// goes behind the fence. It logs which.
func (pt *partition) deliveryGap(last, c uint64) bool {
	switch {
	case last == 0, c == 0, c == last+1:
		return false
	case c > last+1:
		pt.log.Warn("a delivery of the partition never arrived (JetStream failover?); holding its newer events until it is redelivered",
			slog.Uint64("expected_delivery", last+1), slog.Uint64("got_delivery", c))
	default:
		pt.log.Warn("the partition's delivery sequence went back (a new consumer leader behind the old one?); holding its newer events until every pending one is in hand",
			slog.Uint64("expected_delivery", last+1), slog.Uint64("got_delivery", c))
	}
	return true
}

// dispatch hands msg to its stream's lane, holds it when its stream is
// parked, keeps it while an earlier event of its stream has not arrived
// (see successors.handOn), and acks a stale copy of an event already
// settled (a redelivery that raced its own ack). Then the events waiting
// for msg go on. Only the run loop calls it.
func (pt *partition) dispatch(msg jetstream.Msg, wg *sync.WaitGroup) {
	key := wire.StreamKey(msg.Subject())
	pt.dispatchOne(key, msg, wg)
	pt.dispatchWaiting(key, wg)
}

// dispatchWaiting hands on the waiting events of stream key that follow
// one another from its last one handed on.
func (pt *partition) dispatchWaiting(key string, wg *sync.WaitGroup) {
	for m := pt.succ.nextWaiting(key); m != nil; m = pt.succ.nextWaiting(key) {
		pt.dispatchOne(key, m, wg)
	}
}

// dispatchOne is dispatch without the waiting events.
func (pt *partition) dispatchOne(key string, msg jetstream.Msg, wg *sync.WaitGroup) {
	seq := streamSeq(msg)
	if pt.ackSettledCopy(msg) {
		return
	}
	behind, _ := pt.book.settledBefore(key, seq)
	if behind {
		// Never settled, yet a later event of its stream was: a delivery
		// lost on its way that the gap fence did not see. Delivered late
		// rather than acked unsent: out of order beats lost.
		pt.log.Warn("an event arrived after a later event of its stream was settled; delivering it late", slog.String("event_id", attempt.EventID(msg)), slog.Uint64("seq", seq))
	}
	if pt.aside.takes(key, msg, pt.lease.mayAck) {
		return // set aside: read again from the copy (aside.go)
	}
	if !pt.succ.handOn(key, msg) {
		return
	}
	if pt.parking.Hold(pt.holder, msg) {
		return
	}
	pt.toLane(key, msg, wg)
}

// toLane submits msg, handed on, to its stream's lane.
func (pt *partition) toLane(key string, msg jetstream.Msg, wg *sync.WaitGroup) {
	if !pt.book.enterLane(streamSeq(msg)) {
		// A redelivered copy of an event still in its lane (it waited in
		// the client's pull buffer past AckWait): the copy in the lane
		// settles it; this one must not come after its successor.
		return
	}
	pt.inHand.enter()
	pt.lanes.submit(key, msg, wg, func(m jetstream.Msg) {
		defer pt.leftLane(streamSeq(m))
		pt.hol.deliver(m)
	}, nil)
}

// ackSettledCopy acks msg without a POST and reports true when it is a
// copy of an event settled already: recently by this partition (a
// redelivery that raced its own ack, or whose ack did not land), or by a
// former owner, as the delivered record read at the take says (answered
// 2xx or dead-lettered, then its owner froze or died before the ack).
func (pt *partition) ackSettledCopy(msg jetstream.Msg) bool {
	key, seq := wire.StreamKey(msg.Subject()), streamSeq(msg)
	_, stale := pt.book.settledBefore(key, seq)
	if !stale && !pt.record.covers(key, seq) {
		return false
	}
	if !stale {
		pt.book.settled(key, seq)
		pt.log.Debug("a former owner delivered this event (the delivered record says so); acked without a POST", slog.String("event_id", attempt.EventID(msg)), slog.Uint64("seq", seq))
	}
	if pt.lease.mayAck() == nil {
		_ = msg.Ack()
	}
	pt.succ.settledCopy(key, seq)
	return true
}

// leftLane records that the event at seq left its lane (settled, held or
// returned).
func (pt *partition) leftLane(seq uint64) {
	pt.book.leftLane(seq)
	pt.inHand.leave()
}
