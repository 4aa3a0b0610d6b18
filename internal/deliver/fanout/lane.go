package fanout

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// subState is one subscription on the partition. Its fields are the
// Partition's, under its mutex.
type subState struct {
	m     *member.Entry
	state string // "": live; else its cursor's state
	gone  bool   // forgotten: its sends stop
	read  uint64 // with a cursor: the last sequence its reads covered
	from  uint64 // joined live above the head: its events from from+1 on
	// top: with a cursor from the claim, the highest sequence it says
	// settled (position.Cursor.Top); it rejoins from no head below it
	top uint64
	// joining: its reads reached this head and it is live again above
	// it, but its cursor stays until the events it read are settled
	joining uint64
	inHand  map[uint64]bool    // dispatched, not settled → counted in the floor's window
	lanes   map[string]*lane   // ordered: by stream
	last    map[string]settled // ordered: by stream, its last event settled here
	queue   []reader.Event     // unordered: waiting for a send slot
	flying  int                // unordered: sends running
	high    uint64             // unordered: the highest sequence it settled (Close)
}

// lane is one ordered subscription's stream: its events in stream order,
// the head first, sent one at a time by one goroutine.
type lane struct {
	stream  string
	q       []reader.Event
	running bool      // its goroutine runs
	since   time.Time // its head's first failed attempt (zero: none)
}

// settled is the last event of a stream an ordered subscription settled
// on the partition: its next event waits for the commit covering seq
// (write before next) and names prev as its predecessor. Kept per stream
// for as long as the partition is owned, as today's chain.go does.
type settled struct {
	seq  uint64
	prev int64
}

// sub returns m's state on the partition, made at its first event: a
// subscription the record does not list and that has no cursor is new,
// and joins live from just before that event (from).
func (p *Partition) sub(m *member.Entry, from uint64) *subState {
	st := p.subs[m.Name]
	if st == nil {
		st = &subState{m: m, inHand: map[uint64]bool{}}
		if c, ok := p.curs[m.Name]; ok {
			st.state, st.read, st.top = c.State, c.Floor, c.Top()
			if c.State == StateHeld { // a stranger's place: it is ours now
				st.state = StateBehind
				p.pos.EditCursor(m.Name, func(c *position.Cursor) { c.State = StateBehind })
			}
		} else if _, ok := p.claimed.Members[m.Name]; !ok {
			p.pos.Edit(func(r *position.Record) { r.Members[m.Name] = from })
		}
		p.subs[m.Name] = st
		delete(p.held, m.Name)
		p.mark(st)
	}
	if st.m != m {
		st.m = m // put again: its new limits
	}
	return st
}

// push hands ev to st's lane for stream (ordered) or its sends
// (unordered); counted says it holds the floor back until settled.
func (p *Partition) push(st *subState, ev reader.Event, stream string, counted bool) {
	st.inHand[ev.Seq] = counted
	if st.m.Ordered {
		if st.lanes == nil {
			st.lanes, st.last = map[string]*lane{}, map[string]settled{}
		}
		l := st.lanes[stream]
		if l == nil {
			l = &lane{stream: stream}
			st.lanes[stream] = l
		}
		l.q = append(l.q, ev)
		if !l.since.IsZero() {
			p.retried = append(p.retried, stuckLane{st, l}) // Dispatch looks once ev is in the floor's window
		}
		if !l.running {
			l.running = true
			p.wg.Add(1)
			t, _ := p.turnLocked(st, l)
			p.starts = append(p.starts, start{st: st, l: l, t: t})
		}
		return
	}
	if st.flying < st.m.MaxInFlight {
		st.flying++
		p.wg.Add(1)
		p.starts = append(p.starts, start{st: st, t: turn{ev: ev}})
		return
	}
	st.queue = append(st.queue, ev)
}

// start is a lane's run (l set) or an unordered send to start once the
// partition's lock is released: started under it, its goroutine's first
// act would be to wait for it.
type start struct {
	st *subState
	l  *lane
	t  turn
}

// unlock releases the partition's lock and starts the runs and sends
// pushed meanwhile. Only the dispatch loop pushes (Dispatch, CatchUp),
// so only it finds starts here, and it alone uses spare.
func (p *Partition) unlock() {
	if len(p.starts) == 0 {
		p.mu.Unlock()
		return
	}
	starts := p.starts
	p.starts, p.spare = p.spare[:0], nil
	p.mu.Unlock()
	for i, s := range starts {
		if s.l != nil {
			go p.runLane(s.st, s.l, s.t)
		} else {
			go p.runSends(s.st, s.t.ev, s.st.m.Name)
		}
		starts[i] = start{}
	}
	p.spare = starts[:0]
}

// turn is what a lane's next turn sends: its head, its stream's last
// event settled here (known), the claim's entry for the stream, and the
// attempts its retries entry counts (0: none).
type turn struct {
	ev    reader.Event
	last  settled
	known bool
	entry position.Entry
	tried int
}

// turnLocked returns l's next turn, or false when l is empty (or its
// subscription forgotten): l stops running.
func (p *Partition) turnLocked(st *subState, l *lane) (turn, bool) {
	if len(l.q) == 0 || st.gone {
		l.running = false
		if st.lanes[l.stream] == l && len(l.q) == 0 {
			delete(st.lanes, l.stream)
		}
		return turn{}, false
	}
	t := turn{ev: l.q[0], entry: p.entryLocked(st.m.Name, l.stream)}
	t.last, t.known = st.last[l.stream]
	t.tried = int(p.retries[retryKey{st.m.Name, t.ev.Seq}]) // only its lane writes the head's entry
	return t, true
}

// settleLocked takes seq out of st's hand and out of the floor's window.
func (p *Partition) settleLocked(st *subState, seq uint64) {
	counted, ok := st.inHand[seq]
	if !ok {
		return
	}
	delete(st.inHand, seq)
	if counted {
		p.win.Done(seq)
		p.raise()
	}
}

// runLane sends an ordered lane's events one at a time until it is
// empty: each once the commit covering its predecessor's settlement
// succeeded (write before next), naming the version delivered before it
// (previousOf), attempted until it settles (sendOrdered), and settled
// here: delivered or dead-lettered (the stream's last event, its retries
// entry dropped, out of the floor's window, a stream set aside reading
// on after it), or parked (the stream set aside from it).
func (p *Partition) runLane(st *subState, l *lane, t turn) {
	defer p.wg.Done()
	growStack()
	name := st.m.Name
	for {
		if p.ctx.Err() != nil {
			return // closed: the next owner sends the rest
		}
		ev := t.ev
		if t.known {
			if err := p.pos.Wait(p.ctx, name, l.stream, t.last.seq); err != nil {
				p.fail(err)
				return
			}
		}
		prev, ok := p.previousOf(name, l.stream, t)
		if !ok {
			return // closed: the next owner sends it
		}
		act, ok := p.sendOrdered(st, l, Delivery{Subscription: name, Event: ev, Attempt: t.tried + 1, Spent: t.tried, Ordered: true, Previous: prev,
			Partition: p.cfg.Partition, Epoch: p.cfg.Epoch})
		if !ok {
			return // closed or lost: the next owner sends it again
		}
		woke := false
		p.mu.Lock()
		l.since = time.Time{}
		p.dropRetry(name, ev.Seq)
		switch act {
		case Delivered, DeadLetter:
			e := entryOf(ev.Seq, prev)
			if v, versioned := version(ev); act == Delivered && versioned {
				prev, e.Version = v, uint64(v)
			}
			st.last[l.stream] = settled{seq: ev.Seq, prev: prev}
			p.pos.Settled(name, l.stream, e)
			p.settleLocked(st, ev.Seq)
			l.q = l.q[1:]
			if a := p.asides[[2]string{name, l.stream}]; a != nil && (a.State == AsideReading || a.State == AsideStuck) {
				// What it read (or its stuck head) settled: it reads
				// on after it, and so does a new owner.
				woke = a.State == AsideStuck // its reads start: CatchUp's to do
				p.moveAside(name, l.stream, AsideReading, ev.Seq+1)
				a.read = max(a.read, ev.Seq)
			}
		case Park:
			p.setAside(name, l.stream, AsideParked, ev.Seq) // it covers the head and the events behind it
			for _, e := range l.q {
				p.settleLocked(st, e.Seq)
			}
			l.q = nil
		}
		var more bool
		t, more = p.turnLocked(st, l)
		p.mu.Unlock()
		if woke {
			p.wake() // CatchUp reads the stream on after it
		}
		if !more {
			return
		}
	}
}

// previousOf is the version subscription name delivered of stream before
// t's event (previous), its look-up retried with backoff while it fails
// (the stream waits); false when the fan-out stopped first.
func (p *Partition) previousOf(name, stream string, t turn) (int64, bool) {
	var pause backoff.Backoff
	for {
		prev, err := p.previous(name, stream, t)
		if err == nil {
			return prev, true
		}
		d := pause.Next()
		p.cfg.Logger.Warn("looking up the version its stream delivered before it failed; retrying (its stream waits)",
			slog.String("subscription", name), slog.String("stream", stream), slog.Any("error", err), slog.Duration("retry_in", d))
		if !sleep(p.ctx, p.cfg.Clock, d) {
			return 0, false
		}
	}
}

// previous is the version subscription name delivered of stream before
// t's event: the one its lane settled last (known), else none for
// entryOf is the record's entry of a stream whose last event settled
// is at seq, its Delivery's Previous prev (NoPrevious, or any negative:
// position.NoVersion).
func entryOf(seq uint64, prev int64) position.Entry {
	if prev < 0 {
		return position.Entry{Seq: seq, Version: position.NoVersion}
	}
	return position.Entry{Seq: seq, Version: uint64(prev)}
}

// version 0 or an event without a version, else the claim's entry below
// the event, else the Chain's look-up.
func (p *Partition) previous(name, stream string, t turn) (int64, error) {
	ev, e := t.ev, t.entry
	switch ver, versioned := version(ev); {
	case t.known:
		return t.last.prev, nil
	case !versioned || ver == 0:
		return NoPrevious, nil
	case e.Seq > 0 && e.Seq < ev.Seq && e.Version == position.NoVersion:
		return NoPrevious, nil
	case e.Seq > 0 && e.Seq < ev.Seq:
		return int64(e.Version), nil
	case p.chain == nil:
		return NoPrevious, nil
	}
	return p.chain.Previous(p.ctx, name, stream, ev.Seq)
}

// version returns ev's stream version (ce-streamversion), if it has one.
func version(ev reader.Event) (int64, bool) {
	v, err := strconv.ParseInt(ev.Header.Get(wire.HeaderStreamVersion), 10, 64)
	return v, err == nil && v >= 0
}

// sendOrdered attempts d's event until it settles (Delivered,
// DeadLetter, Park), the failed attempts recorded in the retries
// entries and followed by the retry pause; ok is false when the fan-out
// stopped first. Its POSTs running at once are bounded by the Sender
// (the replica's max_in_flight slots, all partitions together, the
// oldest event first), not here: a bound of the partition's in front
// of it queued a busy stream's next event, first come first served,
// behind the other streams' (issue 33).
func (p *Partition) sendOrdered(st *subState, l *lane, d Delivery) (act Act, ok bool) {
	for ; ; d.Attempt++ {
		if p.ctx.Err() != nil {
			return 0, false
		}
		s := p.send.Attempt(p.ctx, d)
		if s.Act != Retry {
			// Settled, even if Close came meanwhile: the POST it started
			// ran to its answer (graceful release), and the settlement
			// is committed before the partition goes.
			return s.Act, true
		}
		if p.ctx.Err() != nil {
			return 0, false
		}
		p.retrying(st, d.Subscription, d.Event.Seq, s.Spent)
		if !p.retryPause(st, l, d.Subscription, s.Delay) {
			return 0, false
		}
	}
}

// entryLocked is the entry of stream the claim found for subscription
// name: its cursor's when it had one, else the record's (shared or its
// own, the later).
func (p *Partition) entryLocked(name, stream string) position.Entry {
	if c, behind := p.curs[name]; behind {
		return c.Streams[stream]
	}
	e := p.claimed.Streams[stream]
	if a := p.claimed.Ahead[name][stream]; a.Seq > e.Seq {
		e = a
	}
	return e
}

// runSends sends an unordered subscription's events, ev first, then
// those waiting for a slot, each retried until it settles; its
// settlements wait for no commit.
func (p *Partition) runSends(st *subState, ev reader.Event, name string) {
	defer p.wg.Done()
	growStack()
	d := Delivery{Subscription: name, Partition: p.cfg.Partition, Epoch: p.cfg.Epoch}
	for {
		d.Event = ev
		d.Attempt = p.firstAttempt(name, ev.Seq)
		for d.Spent = d.Attempt - 1; ; d.Attempt++ {
			if p.ctx.Err() != nil {
				return // closed: the next owner sends it
			}
			s := p.send.Attempt(p.ctx, d)
			if s.Act != Retry {
				break // settled, even if Close came meanwhile (see sendOrdered)
			}
			if p.ctx.Err() != nil {
				return
			}
			p.retrying(st, name, ev.Seq, s.Spent)
			if !sleep(p.ctx, p.cfg.Clock, s.Delay) {
				return
			}
		}
		p.mu.Lock()
		if st.state != "" {
			p.pos.EditCursor(name, func(c *position.Cursor) { c.Above = append(c.Above, ev.Seq) })
		}
		p.settleLocked(st, ev.Seq)
		p.dropRetry(name, ev.Seq)
		st.high = max(st.high, ev.Seq)
		if len(st.queue) == 0 || st.gone || st.flying > st.m.MaxInFlight || p.ctx.Err() != nil {
			st.flying--
			p.mu.Unlock()
			return
		}
		ev, st.queue = st.queue[0], st.queue[1:]
		p.mu.Unlock()
	}
}

// growStack grows the calling goroutine's stack, once and while it
// holds only a frame or two, to the 8 KB an attempt's way to its POST
// takes (the webhook's building, the breaker, net/http's client). A lane
// run or an unordered send is a goroutine of its own, started on the
// runtime's small initial stack: on the attempt's way the stack grew by
// doubling, each time copied with every frame on it adjusted
// (runtime.newstack, 7-8 % of the consumer's CPU at 1,000 events/s);
// asking for the room at the start costs one copy of a nearly empty
// stack (issue 33, docs/performance.md). Workers that keep their stacks
// were tried for the same and cost as much in hand-overs.
//
//go:noinline
func growStack() byte {
	var room [stackRoom]byte
	return last(room[:])
}

// stackRoom is growStack's frame: with the frames below it and the
// runtime's guard it makes the stack 8 KB (the runtime doubles a stack
// until a frame fits).
const stackRoom = 5 << 10

// last keeps growStack's frame from being optimised away.
//
//go:noinline
func last(b []byte) byte { return b[len(b)-1] }
