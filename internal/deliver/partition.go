package deliver

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/wire"
)

// partition is one owned partition of an ordered subscription: its pull
// loop, its lanes and its lease deadline.
type partition struct {
	or *orderedRunner
	r  *runner // the subscription's: its sender, dead letters and metrics
	// eventsPrefix is the events stream's subject prefix, to name an event
	// as on the events stream (spans, records, dead letters).
	eventsPrefix string
	parking      *parking      // the subscription's parked streams
	ackWait      time.Duration // the subscription's AckWait
	checkEvery   time.Duration // how often watchConsumer reads the partition consumer
	clock        clockwork.Clock
	attempts     failedAttempts // the subscription's failed POSTs, across owners
	p            int
	cons         jetstream.Consumer
	log          *slog.Logger

	// floor is the partition consumer's ack floor (stream sequence) as
	// last read by watchConsumer.
	floor atomic.Uint64

	// epoch is the lease's KV create revision (the revision of the Create
	// that claimed it; renewals leave it): every webhook of the partition
	// carries it as Jsbridge-Lease-Epoch.
	epoch uint64
	rev   uint64 // lease revision; the ownership loop's alone
	// connStatus is the NATS connection's status (nil: always connected).
	connStatus func() nats.Status
	lost       bool // the lease is someone else's; the ownership loop's alone

	ctx    context.Context // ends at release
	cancel context.CancelFunc
	done   chan struct{} // closed when every delivery of the partition ended

	mu       sync.Mutex
	deadline time.Time         // no attempt starts after it
	lastDone map[string]uint64 // stream key → sequence of the last event settled
	recent   map[uint64]bool   // the recently settled sequences (at most settledKept)
	recentQ  []uint64          // recent's sequences, oldest first
	inLane   map[uint64]bool   // sequences submitted to a lane and not left it
	acking   map[uint64]bool   // sequences whose ack was sent and not confirmed yet
	lanes    lanes
	// waiting holds, by stream key, events that arrived while an earlier
	// event of their stream that the partition consumer delivers was not
	// handed on yet (lost on its way, to be redelivered), in stream order.
	waiting map[string][]waitingMsg

	// The run loop's alone:
	seen     map[string]streamPos // stream key → the last event of the stream handed on (to its lane, or held)
	checks   chan successorCheck  // answers of the successor look-ups running
	checking map[string]bool      // stream keys with a successor look-up running
	filters  []string             // the partition consumer's filter subjects
	// successor looks up a stream's next event (successorSeq; tests
	// replace it).
	successor func(key string, after uint64) (uint64, error)
}

// streamPos is the last event of a stream a partition handed on: its
// sequence in the partitioned stream and its stream version, and the
// sequence of the stream's next event the partition consumer delivers when
// known (0: not looked up).
type streamPos struct {
	seq       uint64
	version   int64
	versioned bool
	next      uint64
}

// waitingMsg is an event waiting for an earlier event of its stream, and
// since when.
type waitingMsg struct {
	msg   jetstream.Msg
	since time.Time
}

// successorCheck is the answer of a look-up of the stream key's first
// event after sequence after that the partition consumer delivers: at
// sequence next (0: none), or err.
type successorCheck struct {
	key   string
	after uint64
	next  uint64
	err   error
}

func (pt *partition) setDeadline(t time.Time) {
	pt.mu.Lock()
	pt.deadline = t
	pt.mu.Unlock()
}

// mayStart reports whether an attempt may start: the partition was not
// released and its lease was renewed recently enough (a replica frozen
// past its deadline starts nothing more when it wakes up).
func (pt *partition) mayStart() bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.ctx.Err() == nil && pt.clock.Now().Before(pt.deadline)
}

// waitLease waits while the lease deadline is passed (a renewal late, or a
// replica waking from a freeze) and reports whether the partition is still
// this replica's: false once it was released or its lease found lost. An
// event never gives way to its successor while it waits.
func (pt *partition) waitLease() bool {
	for !pt.mayStart() {
		if pt.ctx.Err() != nil {
			return false
		}
		select {
		case <-pt.ctx.Done():
		case <-pt.clock.After(20 * time.Millisecond):
		}
	}
	return true
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
		if pt.mayAck() != nil {
			return nil // past the lease deadline, or disconnected: no InProgress
		}
		return append(append(fence.snapshot(), pt.lanes.queued()...), pt.waitingMsgs()...)
	})
	go pt.watchConsumer(kctx, pt.checkEvery)

	fencing := true
	var lastCheck time.Time
	// lastCSeq is the delivery sequence of the last message received.
	// A jump past lastCSeq+1 means a delivery never arrived (a server that
	// died while sending it): it comes back after AckWait, and until then
	// nothing newer of the partition may go out (the fence again). A
	// sequence at or below lastCSeq means a new consumer leader whose
	// replicated state lagged behind the old one's: it numbers its
	// deliveries again from where its state ends, so a later jump would
	// hide below lastCSeq; the partition goes behind the fence too, and
	// follows the new leader's numbering from there.
	var lastCSeq uint64
	var lastUnstick time.Time
	for pt.ctx.Err() == nil {
		if !pt.leaseHeld() {
			// Past the lease deadline: pull nothing until a renewal.
			// What was pulled and not delivered yet is pending on the
			// consumer: behind the fence again until it is back.
			if iter = pt.pausePull(iter, stopReading); iter == nil {
				stopReading = nil
				break
			}
			stopReading = make(chan struct{})
			pulled = pt.read(iter, stopReading)
			fencing = true
			lastCheck = pt.clock.Now()
			continue
		}
		if !fencing && pt.or.inHand.Load() >= pt.or.handLimit() {
			// Enough events in the lanes: pull no more for now (what
			// waits in JetStream needs no InProgress).
			for _, m := range pt.parking.releaseFor(pt) {
				pt.dispatch(m, &wg)
			}
			select {
			case <-pt.ctx.Done():
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
				msg = parsedOnce(msg)
			}
		case c := <-pt.checks:
			pt.checked(c, &wg)
			continue
		case <-pt.clock.After(fenceCheck):
			err = nats.ErrTimeout
		case <-pt.ctx.Done():
			continue
		}
		if !fencing {
			// Events of unparked streams go first, before a newer one
			// of theirs just pulled.
			for _, m := range pt.parking.releaseFor(pt) {
				pt.dispatch(m, &wg)
			}
		}
		if err == nil {
			c := consumerSeq(msg)
			switch {
			case fencing, lastCSeq == 0, c == 0, c == lastCSeq+1:
			case c > lastCSeq+1:
				pt.log.Warn("a delivery of the partition never arrived (JetStream failover?); holding its newer events until it is redelivered",
					slog.Uint64("expected_delivery", lastCSeq+1), slog.Uint64("got_delivery", c))
				fencing = true
				lastCheck = pt.clock.Now()
			default:
				pt.log.Warn("the partition's delivery sequence went back (a new consumer leader behind the old one?); holding its newer events until every pending one is in hand",
					slog.Uint64("expected_delivery", lastCSeq+1), slog.Uint64("got_delivery", c))
				fencing = true
				lastCheck = pt.clock.Now()
			}
			if c != 0 {
				lastCSeq = c
			}
		}
		switch {
		case err == nil && fencing:
			fence.add(msg)
		case err == nil:
			pt.dispatch(msg, &wg)
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			pt.log.Warn("partition pull ended; restarting it")
			iter, err = pt.cons.Messages(pt.pullOpts()...)
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
		if !fencing && pt.clock.Since(lastUnstick) >= pt.ackWait {
			lastUnstick = pt.clock.Now()
			pt.unstick(&wg)
		}
		if fencing && pt.clock.Since(lastCheck) >= fenceCheck {
			lastCheck = pt.clock.Now()
			info, err := pt.cons.Info(pt.ctx)
			if err == nil {
				pt.floor.Store(info.AckFloor.Stream)
			}
			// Pending on the consumer: what is in hand (the fence, the
			// lanes, held behind a parked head) and what is lost on its
			// way; the fence passes when nothing is lost any more.
			if err == nil && info.NumAckPending <= pt.handCount(&fence) {
				// The park state from the bucket, not the watch's cache.
				if err := pt.parking.reread(pt.ctx); err != nil {
					pt.log.Warn("re-reading the parked streams failed; the fence waits", slog.Any("error", err))
					continue
				}
				fencing = false
				msgs := fence.take()
				if len(msgs) > 0 {
					pt.log.Info("partition fence passed: every pending event is in hand", slog.Int("events", len(msgs)))
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
	for _, m := range append(fence.take(), pt.takeWaiting()...) {
		pt.nak(pt.log, m)
	}
	pt.parking.returnHeld(pt)
}

// openPull opens the partition consumer's pull iterator, retrying with
// backoff until it opens; nil when the partition was released first.
func (pt *partition) openPull() jetstream.MessagesContext {
	var pause backoff.Backoff
	for pt.ctx.Err() == nil {
		iter, err := pt.cons.Messages(pt.pullOpts()...)
		if err == nil {
			return iter
		}
		if consumerGone(err) {
			// The partition ends; the ownership loop makes the consumer
			// again (ensureConsumer) and claims it anew.
			pt.log.Warn("the partition consumer no longer exists; releasing the partition to create it again", slog.Any("error", err))
			return nil
		}
		d := pause.Next()
		pt.log.Warn("pulling from a partition failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		sleep(pt.ctx, pt.clock, d)
	}
	return nil
}

// stopPull drains iter: the reader returns what was buffered (each
// message Nak'd for the next owner), then ends; what it reads after
// stopReading it Naks itself.
func (pt *partition) stopPull(iter jetstream.MessagesContext, in <-chan pulled) {
	iter.Drain()
drain:
	for {
		select {
		case p := <-in:
			if p.err != nil {
				break drain
			}
			pt.nak(pt.log, p.msg)
		case <-time.After(time.Second):
			break drain
		}
	}
	iter.Stop()
}

// read reads iter on its own goroutine (readPull), with room for two pull
// batches; a message read once stop is closed is Nak'd.
func (pt *partition) read(iter jetstream.MessagesContext, stop <-chan struct{}) <-chan pulled {
	return readPull(iter, stop, 2*pt.or.pullBatch(), func(m jetstream.Msg) { pt.nak(pt.log, m) })
}

// dispatch hands msg to its stream's lane, holds it when its stream is
// parked, keeps it while an earlier event of its stream has not arrived
// (see handOn), and acks a stale copy of an event already settled (a
// redelivery that raced its own ack). Then the events waiting for msg go
// on. Only the run loop calls it.
func (pt *partition) dispatch(msg jetstream.Msg, wg *sync.WaitGroup) {
	key := wire.StreamKey(msg.Subject())
	pt.dispatchOne(key, msg, wg)
	pt.dispatchWaiting(key, wg)
}

// dispatchOne is dispatch without the waiting events.
func (pt *partition) dispatchOne(key string, msg jetstream.Msg, wg *sync.WaitGroup) {
	seq := streamSeq(msg)
	pt.mu.Lock()
	behind := seq != 0 && seq <= pt.lastDone[key]
	stale := behind && pt.recent[seq]
	pt.mu.Unlock()
	if stale {
		if pt.mayAck() == nil {
			_ = msg.Ack()
		}
		return
	}
	if behind {
		// Never settled, yet a later event of its stream was: a delivery
		// lost on its way that the gap fence did not see. Delivered late
		// rather than acked unsent: out of order beats lost.
		pt.log.Warn("an event arrived after a later event of its stream was settled; delivering it late", slog.String("event_id", eventID(msg)), slog.Uint64("seq", seq))
	}
	if !pt.handOn(key, msg) {
		return
	}
	if pt.parking.hold(pt, key, msg) {
		return
	}
	pt.mu.Lock()
	dup := pt.inLane[seq]
	if !dup && seq != 0 {
		pt.inLane[seq] = true
	}
	pt.mu.Unlock()
	if dup {
		// A redelivered copy of an event still in its lane (it waited in
		// the client's pull buffer past AckWait): the copy in the lane
		// settles it; this one must not come after its successor.
		return
	}
	pt.or.inHand.Add(1)
	pt.lanes.submit(key, msg, wg, func(m jetstream.Msg) {
		defer pt.leftLane(streamSeq(m))
		pt.deliver(m)
	}, nil)
}

// leftLane records that the event at seq left its lane (settled, held or
// returned).
func (pt *partition) leftLane(seq uint64) {
	pt.mu.Lock()
	delete(pt.inLane, seq)
	pt.mu.Unlock()
	pt.or.inHand.Add(-1)
}

// settled records that the event at seq of stream key was acked or
// dead-lettered.
func (pt *partition) settled(key string, seq uint64) {
	pt.mu.Lock()
	if seq > pt.lastDone[key] {
		pt.lastDone[key] = seq
	}
	if !pt.recent[seq] {
		pt.recent[seq] = true
		pt.recentQ = append(pt.recentQ, seq)
		if len(pt.recentQ) > settledKept {
			delete(pt.recent, pt.recentQ[0])
			pt.recentQ = pt.recentQ[1:]
		}
	}
	pt.mu.Unlock()
}

// settledKept bounds the settled sequences a partition remembers to
// recognise a late copy of an event it already settled.
const settledKept = 16384

// handCount is how many distinct events of the partition are in hand and
// not settled nor being acked: in the fence, in the lanes, waiting for a
// predecessor or held behind a parked head.
// Each is counted once: a redelivered copy of an event still in its lane
// (sent again by a new consumer leader, or after AckWait) waits in the
// fence too, and counting it twice would let the fence pass while a lost
// delivery is still on its way, to be sent after its successors.
func (pt *partition) handCount(fence *fenceBuffer) int {
	seqs := map[uint64]bool{}
	fence.mu.Lock()
	for s := range fence.msgs {
		seqs[s] = true
	}
	fence.mu.Unlock()
	pt.mu.Lock()
	for s := range pt.inLane {
		seqs[s] = true
	}
	for _, w := range pt.waiting {
		for _, x := range w {
			seqs[streamSeq(x.msg)] = true
		}
	}
	for s := range seqs {
		if pt.recent[s] || pt.acking[s] {
			// Acked, or maybe: an ack whose answer was lost may be
			// recorded already, and counting its event as pending
			// would hide a lost delivery. Not counted, it makes the
			// fence wait for the ack at worst.
			delete(seqs, s)
		}
	}
	pt.mu.Unlock()
	pt.parking.mu.Lock()
	for _, ps := range pt.parking.parked {
		for _, h := range ps.held {
			if h.pt == pt {
				seqs[streamSeq(h.msg)] = true
			}
		}
	}
	pt.parking.mu.Unlock()
	return len(seqs)
}
