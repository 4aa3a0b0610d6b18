package deliver

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/internal/backoff"
)

// The partition's side: its run loop sets streams aside, starts their
// re-reads and turns them live again.

// tendAside sets aside the streams whose refused head has asideAfter
// events or more queued behind it (or waiting for a predecessor) and was
// refused for asideWait, or at once when the hand limit is full or half
// the partition consumer's MaxAckPending is in hand; it turns
// live again those whose re-read caught up, and starts the re-reads due.
// Only the run loop calls it.
func (pt *partition) tendAside(wg *sync.WaitGroup) {
	as := pt.aside
	if as == nil {
		return
	}
	pt.setAsideParked(wg)
	if !as.any.Load() {
		return
	}
	as.tendStuck(pt.parking.IsParked)
	pressed := pt.inHand.full() || (pt.maxAckPending > 0 && pt.book.inHand() >= pt.maxAckPending/2)
	for key, h := range as.candidates(pressed) {
		if pt.lanes.queuedOf(key)+pt.book.waitingOf(key) >= asideAfter {
			pt.setAside(key, h, wg)
		}
	}
	for key, c := range as.caughtUp() {
		if c.settled || (c.outDone && pt.asideFloor() >= c.at-1) {
			pt.goLive(key, c.at)
		}
	}
	for key, from := range as.toRead(pt.mayReread) {
		wg.Add(1)
		go pt.reread(key, from, wg)
	}
}

// setAside sets stream key aside (see asides): it takes the events queued
// behind the refused head and those waiting for a predecessor out of
// hand, records the stream aside from the first of them, then acks them
// out. When the record cannot be written they go back where they were.
func (pt *partition) setAside(key string, head refusedHead, wg *sync.WaitGroup) {
	if pt.lease.mayAck() != nil {
		return // past the lease deadline, or disconnected: nothing is acked out
	}
	queued := pt.lanes.takeQueued(key)
	for _, m := range queued {
		pt.leftLane(streamSeq(m))
	}
	waiting := pt.book.takeWaitingOf(key)
	// A parked stream's held events (setAsideParked) come before those
	// queued in its lane and waiting.
	held := pt.parking.TakeHeld(pt.holder, head.subject)
	out := append(append(slices.Clip(held), queued...), waiting...)
	if len(out) == 0 {
		return
	}
	from := streamSeq(out[0])
	for _, m := range out {
		from = min(from, streamSeq(m))
	}
	ctx, cancel := pt.lease.BeforeDeadline(pt.ctx, 5*time.Second)
	err := pt.aside.record(ctx, key, head, from)
	cancel()
	if err != nil {
		pt.log.Warn("setting a stuck stream aside failed; its events stay in hand", slog.String("stream_key", key), slog.Any("error", err))
		for _, m := range queued {
			pt.toLane(key, m, wg)
		}
		for _, m := range waiting {
			pt.succ.wait(key, m)
		}
		for _, m := range held {
			pt.parking.Hold(pt.holder, m)
		}
		return
	}
	pt.aside.ackOut(key, out, pt.lease.mayAck)
	if len(held) > 0 {
		pt.log.Info("a parked stream's later events are set aside: acked out, and read again from the copy once it is unparked",
			slog.String("stream_key", key), slog.Uint64("from", from), slog.Int("events", len(out)))
		return
	}
	pt.log.Info("a stream's head is refused and its later events pile up: the stream is set aside, its later events acked out and read again from the copy once the head goes",
		slog.String("stream_key", key), slog.Uint64("from", from), slog.Int("events", len(out)))
}

// setAsideParked sets aside the parked streams (a head dead-lettered
// and parked) whose later events this partition holds, so that they do
// not count against the partition consumer's MaxAckPending while the
// stream waits for `consumer dlq replay` or `skip`: every parked
// stream holding events here, once the limits press (the hand limit is
// full, or what is in hand and held reaches half of MaxAckPending). Until
// then the held events stay in memory (a replay delivers them even once
// the copy removed them, see docs/ordering.md, "The copy's retention"),
// and a stream held and released within that costs no KV write. The
// stream is set aside as
// one whose head is refused (setAside), from its first event held: the
// events held, queued in its lane and waiting for a predecessor are
// acked out, and those that come later as they come (asides.takes); it
// is read again from the copy once unparked (mayReread). Events held
// again later (one its lane was handing on as it was set aside) are
// acked out on the next pass.
func (pt *partition) setAsideParked(wg *sync.WaitGroup) {
	held, total := pt.parking.HeldBy(pt.holder)
	if len(held) == 0 {
		return
	}
	pressed := pt.inHand.full() || (pt.maxAckPending > 0 && pt.book.inHand()+total >= pt.maxAckPending/2)
	for key, subject := range held {
		if pt.aside.isAside(key) {
			// Held after it was set aside: acked out now (at or after
			// the record's Start, as every event held since is).
			for _, m := range pt.parking.TakeHeld(pt.holder, subject) {
				if !pt.aside.takes(key, m, pt.lease.mayAck) {
					pt.parking.Hold(pt.holder, m)
				}
			}
			continue
		}
		if pressed {
			pt.setAside(key, refusedHead{subject: subject, parked: true}, wg)
		}
	}
}

// asideFloor returns the partition consumer's ack floor, read at most
// once a second (0 until read): what the streams set aside wait for when
// this partition cannot tell by itself.
func (pt *partition) asideFloor() uint64 {
	if pt.clock.Since(pt.asideFloorAt) >= time.Second {
		pt.asideFloorAt = pt.clock.Now()
		ctx, cancel := context.WithTimeout(pt.ctx, 5*time.Second)
		if info, err := pt.cons.Info(ctx); err == nil {
			pt.asideFloorRead = info.AckFloor.Stream
		}
		cancel()
	}
	return pt.asideFloorRead
}

// mayReread reports whether stream key, set aside by rec, may be read
// again now: nothing of it before rec.Start is in hand (its lane ended,
// none waits for a predecessor), it is not parked, and its head when it
// was set aside was settled: here (the stream was set aside here and its
// lane ended, or this partition settled it), or, for a record a former
// owner left, by the former owner (the consumer's ack floor passed it).
// The head not settled comes back to this partition and goes first.
func (pt *partition) mayReread(key string, rec asideRecord, whole bool) bool {
	if pt.lanes.running(key) || pt.book.waitingOf(key) > 0 || pt.parking.IsParked(rec.Subject) {
		return false
	}
	return whole || rec.Head == 0 || pt.book.lastSettled(key) >= rec.Head || pt.asideFloor() >= rec.Head
}

// goLive turns stream key, whose re-read found nothing more from
// sequence at on, live again: no event of it before at can come from the
// partition consumer any more (tendAside: known here, or the consumer's
// ack floor is at at-1 or past it). Its record is deleted, and its next
// event from the partition consumer follows the last one settled (the
// successor check). When the record cannot be deleted, the stream is
// read again (and goLive tried again once that caught up).
func (pt *partition) goLive(key string, at uint64) {
	last, err := pt.aside.goLive(pt.ctx, key, at-1)
	if err != nil {
		pt.log.Warn("a stream set aside caught up, but its record could not be deleted; it is read again", slog.String("stream_key", key), slog.Any("error", err))
		pt.aside.readOn(key)
		return
	}
	pos := streamPos{seq: at - 1}
	if last.seq == at-1 {
		pos = last
	}
	pt.succ.seen[key] = pos
	pt.log.Info("a stream set aside caught up with its live events: it is live again", slog.String("stream_key", key), slog.Uint64("after", at-1))
}

// reread delivers stream key's events from the copy, from sequence from
// on, one at a time through the head of line, until the copy has no more
// (caught up), the stream is parked, or an event is not settled (the
// partition released, or held behind a park).
func (pt *partition) reread(key string, from uint64, wg *sync.WaitGroup) {
	defer wg.Done()
	caughtUp := false
	defer func() { pt.aside.readEnded(key, caughtUp, from) }()
	var pause backoff.Backoff
	for pt.ctx.Err() == nil {
		raw, err := pt.aside.next(pt.ctx, key, from)
		if err != nil {
			if pt.ctx.Err() != nil {
				return
			}
			d := pause.Next()
			pt.log.Warn("reading a stream set aside from the copy failed; retrying (the stream waits)", slog.String("stream_key", key), slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
			sleep(pt.ctx, pt.clock, d)
			continue
		}
		pause.Reset()
		if raw == nil {
			caughtUp = true
			return
		}
		m := newCopyMsg(raw)
		pt.hol.deliver(m)
		if !m.acked.Load() {
			return
		}
		from = raw.Sequence + 1
		if pt.parking.IsParked(raw.Subject) {
			return // dead-lettered and parked: read on once unparked
		}
	}
}
