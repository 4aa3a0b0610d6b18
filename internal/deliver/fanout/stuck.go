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

// retryPause waits d before the next attempt at l's head, and sets its
// stream aside when the stuck-stream rule says so meanwhile (it wakes at
// the rule's times to look), waking the dispatch loop (Config.Wake): the
// last event may have come already, and only CatchUp reads the stream's
// later events once the head settles. It returns false when the fan-out
// stopped.
func (p *Partition) retryPause(st *subState, l *lane, name string, d time.Duration) bool {
	clock := p.cfg.Clock
	end := clock.Now().Add(d)
	for {
		p.mu.Lock()
		now := clock.Now()
		if l.since.IsZero() {
			l.since = now
		}
		next := end
		set := false
		if p.asides[[2]string{name, l.stream}] == nil {
			if set = p.stuck(l, now); set {
				p.setStuck(st, l)
			} else {
				for _, t := range []time.Time{l.since.Add(stuckQueuedAfter), l.since.Add(stuckAfter)} {
					if t.After(now) && t.Before(next) {
						next = t
					}
				}
			}
		}
		p.mu.Unlock()
		if set {
			p.wake() // the dispatch loop may wait for an event that never comes
		}
		if !now.Before(end) {
			return p.ctx.Err() == nil
		}
		if !sleep(p.ctx, clock, next.Sub(now)) {
			return false
		}
	}
}
