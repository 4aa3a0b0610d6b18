package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/jsapi"
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
// A stream's first event since the partition was taken is handed on at
// once only when it is the stream's version 0, or the next sequence after
// its base: the higher of the consumer's ack floor read when the fence
// passed and the stream's entry in the delivered record read at the take
// (delivered.go). Any other waits until JetStream names it the stream's
// first event after that base (the copy's stream leader, asked by
// subject): everything at or below the floor was acked, everything of
// the stream at or below its entry was settled, and an earlier event of
// the stream above both was never acked (acks follow the record): it is
// pending, comes, and goes first. No timeout decides anything. The one
// kind of event acked above both is one acked out of a stream set aside
// (aside.go): while its aside record stands, the stream's events go to
// asides.takes before this check, and the events read again move the
// stream's entry as they settle, so its first live event again follows
// one at or below its entry. "Never acked" fails in two more ways, and
// neither is left to wait for ever (successorreset.go): a copy of the
// event acked as settled never reaches a lane (settledCopy moves its
// stream on), and an event a consumer leader dropped from its state is
// never redelivered (resetForPredecessors). The fence's count alone let a
// version out before an earlier one in a soak run with the events
// stream's leader SIGKILLed every 8-12 s: a consumer leader that had just
// taken over counted the earlier one as neither pending nor delivered.
//
// An event is the successor of the stream's last one handed on when its
// stream version is one more (the events table numbers each stream's
// versions 0, 1, 2, …), or, when the versions do not say (a gap: a
// subscription filtering by event name, a table with holes, an event lost
// on its way), when JetStream answers that it is the stream's first event
// after the last one that the consumer's filters match (the copy's
// stream leader, asked by subject: successorSeq). An event that is not waits in the partition until its
// predecessor was handed on.
//
// The version chain (chain.go) does not replace this check: it lets a
// receiver behind an order gate refuse an event sent out of order, and
// it relies on this check for its own look-up (a stream's events before
// the one sent were settled). A receiver without a gate gets its order
// from this check alone.

// successors is a partition's successor check: the last event of each
// stream it handed on, and the look-ups of a stream's next event running.
// Only the partition's run loop calls its methods (the look-ups answer on
// checks).
type successors struct {
	ctx     context.Context // the partition's: ends at release
	clock   clockwork.Clock
	log     *slog.Logger
	book    *handBook // the partition's: its waiting events
	cons    jetstream.Consumer
	filters []string // the partition consumer's filter subjects
	// copyStream returns the partitioned copy (successorSeq reads it
	// from its leader, through js).
	copyStream func(context.Context) (jetstream.Stream, error)
	js         jetstream.JetStream
	// lookup looks up a stream's next event (successorSeq; tests
	// replace it).
	lookup func(key string, after uint64) (uint64, error)

	// floor is the partition consumer's ack floor (a sequence of the
	// partitioned stream) when the fence last passed; floorSet is false
	// before (a stream's first event is then left to the fence).
	floor    uint64
	floorSet bool
	// inherited returns a stream's entry in the delivered record as the
	// partition read it when it was taken (0: none).
	inherited func(key string) uint64

	seen     map[string]streamPos // stream key → the last event of the stream handed on (to its lane, or held)
	checks   chan successorCheck  // answers of the look-ups running
	checking map[string]bool      // stream keys with a look-up running
	// moved holds the stream keys whose last event moved on by a copy
	// acked as settled (settledCopy): the run loop hands their waiting
	// events on (takeMoved).
	moved map[string]bool
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

// successorCheck is the answer of a look-up of the stream key's first
// event after sequence after that the partition consumer delivers: at
// sequence next (0: none), or err.
type successorCheck struct {
	key   string
	after uint64
	next  uint64
	err   error
}

func newSuccessors(ctx context.Context, clock clockwork.Clock, log *slog.Logger, book *handBook,
	cons jetstream.Consumer, filters []string, copyStream func(context.Context) (jetstream.Stream, error), inherited func(string) uint64) *successors {
	sc := &successors{
		ctx: ctx, clock: clock, log: log, book: book, cons: cons, filters: filters, copyStream: copyStream, inherited: inherited,
		seen: map[string]streamPos{}, checks: make(chan successorCheck), checking: map[string]bool{}, moved: map[string]bool{},
	}
	sc.lookup = sc.successorSeq
	return sc
}

// unstickAfter is how long an event may wait for its predecessor before
// the partition asks whether the ack floor passed that predecessor
// meanwhile (then it never comes back); the partition asks at most this
// often.
const unstickAfter = time.Second

// fencePassed records the partition consumer's ack floor (a sequence of
// the partitioned stream) read when the fence passed.
func (sc *successors) fencePassed(floor uint64) {
	sc.floor, sc.floorSet = floor, true
}

// base returns what a stream's first event since the partition was taken
// is measured against: the highest of the ack floor, the stream's entry
// in the delivered record and its last event settled here (everything of
// the stream at or below the last two was settled).
func (sc *successors) base(key string) uint64 {
	return max(sc.floor, sc.inherited(key), sc.book.lastSettled(key))
}

// settledCopy records that a copy of the event at seq of stream key was
// acked as settled, without being handed on (partition.ackSettledCopy:
// a former owner's, or this owner's before a reset of the consumer). It
// never comes to a lane again, so the stream's later events must not
// wait for it: the stream's last event moves on to it, and the run loop
// hands on what waits behind it (takeMoved). Before, the successor check
// kept naming it the stream's next event (it is above the ack floor,
// which another event held down) and the stream waited for it for ever:
// a soak run with the events stream's leader SIGKILLed every 8-12 s
// stopped a partition so, after two fence resets.
func (sc *successors) settledCopy(key string, seq uint64) {
	last, known := sc.seen[key]
	if !known || seq == 0 || seq <= last.seq {
		return // a first event is measured against base, which has it
	}
	sc.seen[key] = streamPos{seq: seq}
	if sc.book.waitingOf(key) > 0 {
		sc.moved[key] = true
	}
}

// takeMoved returns and forgets the stream keys whose last event moved on
// by a settled copy while events of theirs wait.
func (sc *successors) takeMoved() []string {
	if len(sc.moved) == 0 {
		return nil
	}
	keys := make([]string, 0, len(sc.moved))
	for k := range sc.moved {
		keys = append(keys, k)
	}
	clear(sc.moved)
	return keys
}

// firstOnTrust reports whether p, the first event of stream key since the
// partition was taken, may be handed on without asking JetStream: no
// floor was read, it is its stream's version 0, or it comes right after
// the stream's base.
func (sc *successors) firstOnTrust(key string, p streamPos) bool {
	return !sc.floorSet || (p.versioned && p.version == 0) || p.seq == sc.base(key)+1
}

// streamVersion returns m's stream version (ce-streamversion), if it has
// one.
func streamVersion(m jetstream.Msg) (int64, bool) {
	v, err := strconv.ParseInt(attempt.HeaderValue(m.Headers(), wire.HeaderStreamVersion), 10, 64)
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
func (sc *successors) handOn(key string, m jetstream.Msg) bool {
	pos := positionOf(m)
	last, known := sc.seen[key]
	switch {
	case pos.seq == 0:
		return true
	case known && pos.seq <= last.seq:
		// A copy of an event handed on already: dispatch's checks.
		return true
	case known && last.precedes(pos), !known && sc.firstOnTrust(key, pos):
		// The next event of the stream, or its first since the
		// partition was taken and known to be the first.
		sc.seen[key] = pos
		return true
	case !known:
		// Its first since the partition was taken: it waits until
		// JetStream names it the stream's first after its base.
		last = streamPos{seq: sc.base(key)}
		sc.seen[key] = last
	}
	sc.wait(key, m)
	if last.next == 0 {
		sc.lookUp(key, last.seq)
	}
	return false
}

// wait keeps m until its predecessor was handed on (handBook.wait).
func (sc *successors) wait(key string, m jetstream.Msg) {
	sc.book.wait(key, m, sc.clock.Now())
}

// nextWaiting removes and returns the first waiting event of stream key
// when it may be handed on now, else nil (after starting a look-up of the
// stream's next event when none is known).
func (sc *successors) nextWaiting(key string) jetstream.Msg {
	head, _ := sc.book.firstWaiting(key)
	if head == nil {
		return nil
	}
	last, pos := sc.seen[key], positionOf(head)
	if pos.seq > last.seq && !last.precedes(pos) {
		if last.next == 0 {
			sc.lookUp(key, last.seq)
		}
		return nil
	}
	sc.book.popWaiting(key)
	return head
}

// lookUp starts a look-up of the first event of stream key after sequence
// after that the partition consumer delivers, unless one runs; its answer
// reaches the run loop on sc.checks (see checked). It retries with backoff
// while JetStream does not answer.
func (sc *successors) lookUp(key string, after uint64) {
	if sc.checking[key] {
		return
	}
	sc.checking[key] = true
	go func() {
		var pause backoff.Backoff
		for {
			next, err := sc.lookup(key, after)
			if err == nil || sc.ctx.Err() != nil {
				select {
				case sc.checks <- successorCheck{key: key, after: after, next: next, err: err}:
				case <-sc.ctx.Done():
				}
				return
			}
			d := pause.Next()
			sc.log.Warn("looking up a stream's next event failed; its later events wait", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
			sleep(sc.ctx, sc.clock, d)
		}
	}()
}

// successorSeq returns the sequence of the first event of stream key
// after sequence after that one of the partition consumer's filters
// matches (0: none), as the copy's stream leader has it
// (jsapi.LeaderFirstAfter). A direct get may be answered by a follower, and a
// follower lacking the event would answer "none", which answered reads
// as "nothing comes before the waiting head": the head would go out
// before its lost predecessor.
func (sc *successors) successorSeq(key string, after uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(sc.ctx, 5*time.Second)
	defer cancel()
	s, err := sc.copyStream(ctx)
	if err != nil {
		return 0, err
	}
	var subjects []string
	for _, f := range sc.filters {
		if subj, ok := wire.IntersectFilters(f, key+".*"); ok {
			subjects = append(subjects, subj)
		}
	}
	if len(subjects) == 0 {
		return 0, nil
	}
	name := s.CachedInfo().Config.Name
	next, _, err := jsapi.LeaderFirstAfter(ctx, sc.js, name, subjects, after+1)
	if err != nil {
		return 0, fmt.Errorf("deliver: look up the next event of a stream in %q: %w", name, err)
	}
	return next, nil
}

// answered records a look-up's answer, the stream's next event, when the
// stream was not handed on further meanwhile.
func (sc *successors) answered(c successorCheck) {
	delete(sc.checking, c.key)
	last, ok := sc.seen[c.key]
	if c.err != nil || !ok || last.seq != c.after {
		return // released, or answered too late
	}
	head, n := sc.book.firstWaiting(c.key)
	if c.next == 0 && n > 0 {
		// None matches after it: the waiting head left the stream
		// (limits) before the look-up; nothing comes before it.
		c.next = streamSeq(head)
	}
	last.next = c.next
	sc.seen[c.key] = last
	if n > 0 && c.next != streamSeq(head) {
		sc.log.Warn("an earlier event of a stream is not in hand (lost on its way, or a former owner's not yet redelivered); holding the stream's later events until it comes",
			slog.Uint64("seq", c.next), slog.Int("waiting", n), slog.String("first_waiting_event_id", attempt.EventID(head)))
	}
}

// unstick looks at the streams whose waiting events waited unstickAfter
// or more for a predecessor JetStream named, and lets go on those whose
// predecessor the ack floor passed (goesOn). It returns the streams that
// go on, which the run loop hands their waiting events on, and the
// consumer's info when streams still wait for a predecessor above the
// floor (nil otherwise), which the run loop checks for a predecessor that
// is not pending at all (partition.predecessorsPending).
func (sc *successors) unstick() (goOn []string, still *jetstream.ConsumerInfo) {
	var stuck []string
	for _, key := range sc.book.waitingSince(sc.clock.Now().Add(-unstickAfter)) {
		if sc.seen[key].next != 0 {
			stuck = append(stuck, key)
		}
	}
	if len(stuck) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(sc.ctx, 5*time.Second)
	info, err := sc.cons.Info(ctx)
	cancel()
	if err != nil {
		return nil, nil
	}
	goOn = sc.goesOn(stuck, info.AckFloor.Stream)
	if len(goOn) < len(stuck) {
		still = info
	}
	return goOn, still
}

// waitsFor returns the lowest sequence in (floor, through] that a stream's
// waiting events wait for (its named predecessor), 0 when none does.
func (sc *successors) waitsFor(floor, through uint64) uint64 {
	var low uint64
	for key, last := range sc.seen {
		n := last.next
		if n > floor && n <= through && (low == 0 || n < low) && sc.book.waitingOf(key) > 0 {
			low = n
		}
	}
	return low
}

// goesOn returns the stuck streams whose named predecessor is at or below
// the consumer's ack floor: acked (it left the copy by its limits, or a
// stale copy of its own predecessor reached this partition), so it never
// comes back; each goes on from the floor. The others keep waiting: their
// predecessor is pending and comes (logged).
func (sc *successors) goesOn(stuck []string, floor uint64) []string {
	var goOn []string
	for _, key := range stuck {
		last := sc.seen[key]
		if last.next > floor {
			sc.log.Warn("a stream's later events still wait for an earlier one to be redelivered", slog.Uint64("seq", last.next),
				slog.Uint64("ack_floor", floor))
			continue
		}
		sc.log.Warn("the event a stream's later events waited for was acked meanwhile; the stream goes on", slog.Uint64("seq", last.next))
		// Every event of the stream at or below the floor was acked.
		sc.seen[key] = streamPos{seq: floor}
		goOn = append(goOn, key)
	}
	return goOn
}
