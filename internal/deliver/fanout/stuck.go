package fanout

import (
	"time"
)

// The stuck-stream rule (docs/design/next-engine.md, section 3, "When a
// live subscription gets one"; today's set-aside rule, aside.go
// asideAfter and asideWait, with a bound of its own): an ordered
// stream's head retried in place holds its stream, and the partition's
// floor, back. Once it has been retried for stuckQueuedAfter with
// stuckQueued of its events or more queued behind it, or for stuckAfter
// whatever is queued, its stream is set aside (AsideStuck, from the
// head): the events queued behind it leave its lane, neither it nor they
// hold the floor back any longer (the aside covers them), the head goes
// on being retried in its lane, and once it settles the stream reads its
// later events again (AsideReading) and rejoins the shared read.
const (
	// stuckQueued is how many events queued behind a retried head set
	// its stream aside after stuckQueuedAfter.
	stuckQueued = 4
	// stuckQueuedAfter is how long a head is retried before the events
	// queued behind it may set its stream aside.
	stuckQueuedAfter = time.Second
	// stuckAfter is how long a head is retried before its stream is set
	// aside whatever is queued: no head holds the floor back longer
	// (the design's R1).
	stuckAfter = 5 * time.Second
)

// stuck reports whether lane l's head, retried since l.since, has held
// its stream long enough at now to be set aside.
func (p *Partition) stuck(l *lane, now time.Time) bool {
	if l.since.IsZero() || len(l.q) == 0 {
		return false
	}
	held := now.Sub(l.since)
	return held >= stuckAfter || held >= stuckQueuedAfter && len(l.q)-1 >= stuckQueued
}

// stuckLane is a lane of a subscription.
type stuckLane struct {
	st *subState
	l  *lane
}

// tendStuck sets aside the streams of the lanes in p.retried (an event
// was queued behind their retried head) that the rule says are stuck.
func (p *Partition) tendStuck() {
	now := p.cfg.Clock.Now()
	for _, sl := range p.retried {
		if p.asides[[2]string{sl.st.m.Name, sl.l.stream}] == nil && p.stuck(sl.l, now) {
			p.setStuck(sl.st, sl.l)
		}
	}
	clear(p.retried)
	p.retried = p.retried[:0]
}

// setStuck sets l's stream aside for st from its head: the events queued
// behind the head leave the lane (the stream's reads bring them back once
// the head settled), and the head stops holding the floor back.
func (p *Partition) setStuck(st *subState, l *lane) {
	head := l.q[0]
	p.setAside(st.m.Name, l.stream, AsideStuck, head.Seq)
	for _, e := range l.q[1:] {
		p.settleLocked(st, e.Seq) // the aside covers them
	}
	clear(l.q[1:])
	l.q = l.q[:1]
	if st.inHand[head.Seq] {
		st.inHand[head.Seq] = false
		p.win.Done(head.Seq)
		p.raise()
	}
}
