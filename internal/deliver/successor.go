package deliver

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/wire"
)

// A partition hands an event of a stream on (to its lane, or held behind
// a parked head) only right after the stream's previous event that the
// partition consumer delivers: its successor. The fence makes sure a new
// owner has every pending event in hand before it starts; this check keeps
// the order afterwards, when a delivery is lost on its way (a server that
// died while sending it, a message dropped by the client) and JetStream
// redelivers it only after AckWait, behind its stream's later events. It
// does not rely on the consumer's pending count, which a new consumer
// leader whose replicated state lags can get wrong (the fence compares
// counts only).
//
// An event is the successor of the stream's last one handed on when its
// stream version is one more (the events table numbers each stream's
// versions 0, 1, 2, …), or, when the versions do not say (a gap: a
// subscription filtering by event name, a table with holes, an event lost
// on its way), when JetStream answers that it is the stream's first event
// after the last one that the consumer's filters match (a direct get by
// subject). An event that is not waits in the partition until its
// predecessor was handed on.

// waitStale is how long an event may wait for its predecessor before the
// partition asks whether that predecessor was acked meanwhile (by a former
// owner: then it never comes back), in AckWaits.
const waitStale = 2

// streamVersion returns m's stream version (ce-streamversion), if it has
// one.
func streamVersion(m jetstream.Msg) (int64, bool) {
	v, err := strconv.ParseInt(header(m.Headers(), wire.HeaderStreamVersion), 10, 64)
	return v, err == nil
}

func positionOf(m jetstream.Msg) streamPos {
	v, ok := streamVersion(m)
	return streamPos{seq: streamSeq(m), version: v, versioned: ok}
}

// precedes reports whether the event at p is known to be the one after
// last in its stream, as the partition consumer delivers them.
func (last streamPos) precedes(p streamPos) bool {
	if last.next != 0 {
		return p.seq == last.next
	}
	return p.versioned && last.versioned && p.version == last.version+1
}

// handOn reports whether m, of stream key, may be handed on now, and
// records it as the stream's last one handed on when it may. When not, m
// waits (see wait). Only the run loop calls it.
func (pt *partition) handOn(key string, m jetstream.Msg) bool {
	pos := positionOf(m)
	last, known := pt.seen[key]
	switch {
	case pos.seq == 0:
		return true
	case known && pos.seq <= last.seq:
		// A copy of an event handed on already: dispatch's checks.
		return true
	case !known, last.precedes(pos):
		// The next event of the stream, or its first since the
		// partition was taken: the fence made sure every pending event
		// was in hand, and this is the first of them.
		pt.seen[key] = pos
		return true
	}
	pt.wait(key, m)
	if last.next == 0 {
		pt.lookUp(key, last.seq)
	}
	return false
}

// wait keeps m until its predecessor was handed on, one copy per
// sequence (the latest, whose ack counts).
func (pt *partition) wait(key string, m jetstream.Msg) {
	seq := streamSeq(m)
	pt.mu.Lock()
	defer pt.mu.Unlock()
	w := pt.waiting[key]
	i, found := slices.BinarySearchFunc(w, seq, func(x waitingMsg, s uint64) int { return compareUint(streamSeq(x.msg), s) })
	if found {
		w[i].msg = m
		return
	}
	pt.waiting[key] = slices.Insert(w, i, waitingMsg{msg: m, since: pt.clock.Now()})
}

// nextWaiting removes and returns the first waiting event of stream key
// when it may be handed on now, else nil (after starting a look-up of the
// stream's next event when none is known).
func (pt *partition) nextWaiting(key string) jetstream.Msg {
	pt.mu.Lock()
	w := pt.waiting[key]
	if len(w) == 0 {
		pt.mu.Unlock()
		return nil
	}
	head := w[0].msg
	last, pos := pt.seen[key], positionOf(head)
	if pos.seq > last.seq && !last.precedes(pos) {
		pt.mu.Unlock()
		if last.next == 0 {
			pt.lookUp(key, last.seq)
		}
		return nil
	}
	if len(w) == 1 {
		delete(pt.waiting, key)
	} else {
		pt.waiting[key] = w[1:]
	}
	pt.mu.Unlock()
	return head
}

// lookUp starts a look-up of the first event of stream key after sequence
// after that the partition consumer delivers, unless one runs; its answer
// reaches the run loop on pt.checks (see checked). It retries with backoff
// while JetStream does not answer.
func (pt *partition) lookUp(key string, after uint64) {
	if pt.checking[key] {
		return
	}
	pt.checking[key] = true
	go func() {
		var pause backoff.Backoff
		for {
			next, err := pt.successor(key, after)
			if err == nil || pt.ctx.Err() != nil {
				select {
				case pt.checks <- successorCheck{key: key, after: after, next: next, err: err}:
				case <-pt.ctx.Done():
				}
				return
			}
			d := pause.Next()
			pt.log.Warn("looking up a stream's next event failed; its later events wait", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
			sleep(pt.ctx, pt.clock, d)
		}
	}()
}

// successorSeq returns the sequence of the first event of stream key
// after sequence after that one of the partition consumer's filters
// matches (0: none).
func (pt *partition) successorSeq(key string, after uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(pt.ctx, 5*time.Second)
	defer cancel()
	s, err := pt.or.copyStream(ctx)
	if err != nil {
		return 0, err
	}
	var next uint64
	for _, f := range pt.filters {
		subj, ok := wire.IntersectFilters(f, key+".*")
		if !ok {
			continue
		}
		m, err := s.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if next == 0 || m.Sequence < next {
			next = m.Sequence
		}
	}
	return next, nil
}

// checked takes a look-up's answer (see answered), then the stream's
// waiting events go on as far as they follow one another.
func (pt *partition) checked(c successorCheck, wg *sync.WaitGroup) {
	pt.answered(c)
	pt.dispatchWaiting(c.key, wg)
}

// answered records a look-up's answer, the stream's next event, when the
// stream was not handed on further meanwhile.
func (pt *partition) answered(c successorCheck) {
	delete(pt.checking, c.key)
	last, ok := pt.seen[c.key]
	if c.err != nil || !ok || last.seq != c.after {
		return // released, or answered too late
	}
	pt.mu.Lock()
	w := pt.waiting[c.key]
	pt.mu.Unlock()
	if c.next == 0 && len(w) > 0 {
		// None matches after it: the waiting head left the stream
		// (limits) before the look-up; nothing comes before it.
		c.next = streamSeq(w[0].msg)
	}
	last.next = c.next
	pt.seen[c.key] = last
	if len(w) > 0 && c.next != streamSeq(w[0].msg) {
		pt.log.Warn("an event of a stream has not arrived (lost on its way?); holding the stream's later events until it is redelivered",
			slog.Uint64("seq", c.next), slog.Int("waiting", len(w)), slog.String("first_waiting_event_id", eventID(w[0].msg)))
	}
}

// dispatchWaiting hands on the waiting events of stream key that follow
// one another from its last one handed on.
func (pt *partition) dispatchWaiting(key string, wg *sync.WaitGroup) {
	for m := pt.nextWaiting(key); m != nil; m = pt.nextWaiting(key) {
		pt.dispatchOne(key, m, wg)
	}
}

// waitingMsgs returns the events waiting for a predecessor.
func (pt *partition) waitingMsgs() []jetstream.Msg {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var out []jetstream.Msg
	for _, w := range pt.waiting {
		for _, x := range w {
			out = append(out, x.msg)
		}
	}
	return out
}

// takeWaiting empties the waiting events and returns them.
func (pt *partition) takeWaiting() []jetstream.Msg {
	out := pt.waitingMsgs()
	pt.mu.Lock()
	defer pt.mu.Unlock()
	clear(pt.waiting)
	return out
}

// unstick looks at the streams whose waiting events waited waitStale
// AckWaits or more for a predecessor JetStream named: one acked meanwhile
// (at or below the consumer's ack floor: a former owner acked it, and a
// stale copy of its own predecessor reached this one) never comes back, so
// the stream goes on from it. Only the run loop calls it.
func (pt *partition) unstick(wg *sync.WaitGroup) {
	limit := pt.clock.Now().Add(-waitStale * pt.ackWait)
	var stuck []string
	pt.mu.Lock()
	for key, w := range pt.waiting {
		if len(w) > 0 && w[0].since.Before(limit) && pt.seen[key].next != 0 {
			stuck = append(stuck, key)
		}
	}
	pt.mu.Unlock()
	if len(stuck) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(pt.ctx, 5*time.Second)
	info, err := pt.cons.Info(ctx)
	cancel()
	if err != nil {
		return
	}
	for _, key := range stuck {
		last := pt.seen[key]
		if last.next > info.AckFloor.Stream {
			pt.log.Warn("a stream's later events still wait for an earlier one to be redelivered", slog.Uint64("seq", last.next),
				slog.Uint64("ack_floor", info.AckFloor.Stream))
			continue
		}
		pt.log.Warn("the event a stream's later events waited for was acked meanwhile; the stream goes on", slog.Uint64("seq", last.next))
		pt.seen[key] = streamPos{seq: last.next}
		pt.dispatchWaiting(key, wg)
	}
}
