package fanout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// States of a stream set aside (position.Aside.State): one stream of an
// ordered subscription whose events the shared read does not hand it
// (the design's section 3, "stream cursor").
const (
	// AsideParked: its head was dead-lettered with on_dead_letter: park;
	// nothing is read until an operator's request (unpark.Request).
	AsideParked = "parked"
	// AsideStuck: its head was retried in place too long; the head goes
	// on being retried in its lane, and once it settles the stream reads
	// its later events (AsideReading).
	AsideStuck = "stuck"
	// AsideReading: a stream cursor reading its events after From-1 from
	// the events stream (CatchUp), until it reaches the head and rejoins
	// the shared read.
	AsideReading = "behind"
)

// aside is one (subscription, stream) set aside: the record's Aside (its
// state and From; a claimed stuck one reads in memory, below), and while
// reading, the last sequence its reads covered and the head it joins at.
type aside struct {
	position.Aside
	read    uint64
	joining uint64 // its reads reached this head: live above it, dropped once what it read settled
}

// asideOf is a claimed record's aside. A stuck one had its head in a
// former owner's lane: this owner reads the stream from the head on.
func asideOf(a position.Aside) *aside {
	if a.State == AsideStuck {
		a.State = AsideReading
	}
	return &aside{Aside: a, read: max(a.From, 1) - 1}
}

// gates reports whether the shared read passes the stream over for the
// subscription (set aside, and not joining).
func (a *aside) gates() bool { return a != nil && a.joining == 0 }

// setAside sets subscription sub's stream aside in state from the event
// at from on, in the record (replacing an aside of the stream it had)
// and in memory.
func (p *Partition) setAside(sub, stream, state string, from uint64) {
	a := &aside{Aside: position.Aside{Sub: sub, Stream: stream, From: from, State: state}, read: from - 1}
	p.asides[[2]string{sub, stream}] = a
	p.recordAside(a.Aside)
	p.cfg.Logger.Warn("a stream was set aside for the subscription", slog.Int("partition", p.cfg.Partition),
		slog.String("subscription", sub), slog.String("stream", stream), slog.String("state", state), slog.Uint64("seq", from))
}

// moveAside sets the aside of sub's stream to state from from, in the
// record and in memory (what it read and its join kept).
func (p *Partition) moveAside(sub, stream, state string, from uint64) {
	a := p.asides[[2]string{sub, stream}]
	a.State, a.From = state, from
	p.recordAside(a.Aside)
}

// recordAside writes a to the record, replacing the aside of its
// subscription's stream it had.
func (p *Partition) recordAside(a position.Aside) {
	p.pos.Edit(func(r *position.Record) {
		if i := slices.IndexFunc(r.Asides, func(x position.Aside) bool { return x.Sub == a.Sub && x.Stream == a.Stream }); i >= 0 {
			r.Asides[i] = a
			return
		}
		r.Asides = append(r.Asides, a)
	})
}

// streamFilters are m's filters narrowed to stream (a wire.StreamKey).
func streamFilters(m *member.Entry, stream string) []string {
	var out []string
	for _, f := range m.Filters {
		if s, ok := wire.IntersectFilters(f, stream+".*"); ok {
			out = append(out, s)
		}
	}
	return out
}

// catchUpStreams is CatchUp's round of the streams set aside: it applies
// the operator's requests to parked ones, reads the reading ones' events
// up to head into their lanes (a stream cursor's read), and drops the
// aside of one whose reads reached the head once what it read settled.
// It returns how many read or wait for their head (not the parked ones).
func (p *Partition) catchUpStreams(ctx context.Context, head uint64) (int, error) {
	type read struct {
		k       [2]string
		st      *subState
		r       cursor.Read
		evs     []reader.Event
		through uint64
	}
	var todo []*read
	n := 0
	p.mu.Lock()
	p.applyRequestsLocked()
	for _, k := range slices.SortedFunc(maps.Keys(p.asides), cmpKey) {
		a := p.asides[k]
		switch {
		case a.State == AsideParked:
			continue
		case a.State == AsideStuck:
		case a.joining == 0 && p.behind(k[0]):
			// Its subscription's cursor reads first, and its floor
			// passed the aside's events unsettled: the aside alone
			// covers them until it is read, once the subscription is
			// live (a next owner's first round, its head still at the
			// record's floor, would join an aside above it).
		case a.joining > 0 || a.read >= head:
			if p.joinStream(k, a, head) {
				continue
			}
		default:
			st := p.subs[k[0]]
			if m, ok := p.members.Entry(k[0]); st == nil && ok {
				st = p.sub(m, p.head)
			}
			if st == nil || st.gone || st.state != "" || len(st.inHand) >= st.m.MaxInHand {
				break // its subscription's cursor reads first
			}
			todo = append(todo, &read{k: k, st: st, r: cursor.Read{Subscription: k[0], Stream: k[1], Filters: streamFilters(st.m, k[1]),
				Partition: p.cfg.Partition, After: a.read, To: head, Max: st.m.MaxInHand - len(st.inHand)}})
		}
		n++
	}
	p.mu.Unlock()
	var err error
	for _, r := range todo {
		if p.cursors == nil {
			return n, ErrNoCursorReader
		}
		evs, through, rerr := p.cursors.Read(ctx, r.r)
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("fanout: read stream %s of %s on partition %d: %w", r.k[1], r.k[0], p.cfg.Partition, rerr))
			r.through = r.r.After
			continue
		}
		r.evs, r.through = evs, min(through, head)
	}
	p.mu.Lock()
	defer p.unlock()
	for _, r := range todo {
		a, st := p.asides[r.k], r.st
		if a == nil || a.State != AsideReading || a.joining > 0 || st.gone || st.state != "" {
			continue
		}
		last := st.last[r.k[1]].seq
		for _, ev := range r.evs {
			if _, held := st.inHand[ev.Seq]; held || ev.Seq <= a.read || ev.Seq <= last || ev.Seq > head || wire.StreamKey(ev.Subject) != r.k[1] {
				continue
			}
			p.push(st, ev, r.k[1], false) // the aside covers it
		}
		a.read = max(a.read, r.through)
		if a.read >= head && p.joinStream(r.k, a, head) {
			n--
		}
	}
	return n, err
}

// behind reports whether subscription sub has a cursor on the partition
// (behind, or not live for another reason), or had one at the claim and
// has no state here yet (not a member of the index yet).
func (p *Partition) behind(sub string) bool {
	if st := p.subs[sub]; st != nil {
		return st.state != ""
	}
	_, ok := p.curs[sub]
	return ok
}

// joinStream makes a reading stream live again from head: the shared
// read hands its later events to its lane (behind those read), and its
// aside is dropped once none of those read is in the lane; it reports
// whether it was.
func (p *Partition) joinStream(k [2]string, a *aside, head uint64) bool {
	if a.joining == 0 {
		a.joining = head
	}
	if st := p.subs[k[0]]; st != nil {
		if l := st.lanes[k[1]]; l != nil && len(l.q) > 0 && l.q[0].Seq <= a.joining {
			return false
		}
	}
	delete(p.asides, k)
	p.pos.Edit(func(r *position.Record) {
		r.Asides = slices.DeleteFunc(r.Asides, func(x position.Aside) bool { return x.Sub == k[0] && x.Stream == k[1] })
	})
	p.dropCursor(k[0])
	p.cfg.Logger.Info("a stream set aside caught up and rejoined the shared read", slog.Int("partition", p.cfg.Partition),
		slog.String("subscription", k[0]), slog.String("stream", k[1]), slog.Uint64("from", a.joining))
	return true
}

// applyRequestsLocked applies the operator's pending requests to the
// parked streams: the head settled (replayed or skipped), the stream
// reads its events from the head's successor on, its next event naming
// the request's Previous; the request is deleted once a commit holds
// that. A request for another head than the parked one (applied before,
// or stale) is deleted unapplied.
func (p *Partition) applyRequestsLocked() {
	rq := p.cfg.Requests
	if rq == nil {
		return
	}
	for k, a := range p.asides {
		req, ok := rq.Get(k[0], k[1])
		if !ok || p.deleting[req.Key] {
			continue
		}
		if a.State == AsideParked && a.From == req.Head {
			m, ok := p.members.Entry(k[0])
			if !ok {
				continue // not a member here (removed, or not put yet): left for later
			}
			st := p.sub(m, p.head)
			if st.lanes == nil {
				st.lanes, st.last = map[string]*lane{}, map[string]settled{}
			}
			st.last[k[1]] = settled{seq: req.Head, prev: req.Previous}
			p.pos.Settled(k[0], k[1], entryOf(req.Head, req.Previous))
			p.moveAside(k[0], k[1], AsideReading, req.Head+1)
			a.read = req.Head
			p.cfg.Logger.Info("a parked stream was unparked by the operator: its later events are read again", slog.Int("partition", p.cfg.Partition),
				slog.String("subscription", k[0]), slog.String("stream", k[1]), slog.String("op", req.Op), slog.Uint64("head", req.Head))
		} else {
			p.cfg.Logger.Info("an operator's request names another head than the parked one: deleted", slog.Int("partition", p.cfg.Partition),
				slog.String("subscription", k[0]), slog.String("stream", k[1]), slog.Uint64("head", req.Head), slog.Uint64("parked", a.From))
		}
		p.deleting[req.Key] = true
		p.wg.Add(1)
		go p.deleteRequest(req)
	}
}

// deleteRequest deletes req once a commit holds what was applied; a
// fan-out closed first leaves it to the next owner (applying it again
// finds the aside moved on, and deletes it).
func (p *Partition) deleteRequest(req unpark.Pending) {
	defer p.wg.Done()
	err := p.pos.Flush(p.ctx)
	if err == nil {
		err = p.cfg.Requests.Delete(p.ctx, req)
	}
	if err != nil && p.ctx.Err() == nil {
		p.cfg.Logger.Warn("deleting an applied request failed; it is applied again (idempotent)", slog.String("key", req.Key), slog.Any("error", err))
	}
	p.mu.Lock()
	delete(p.deleting, req.Key)
	p.mu.Unlock()
}

// cmpKey orders the asides' keys by subscription, then stream.
func cmpKey(a, b [2]string) int {
	return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
}
