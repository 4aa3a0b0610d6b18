package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrNoCursorReader is returned by CatchUp when a subscription is behind
// and the Partition was made without a CursorReader.
var ErrNoCursorReader = errors.New("fanout: a subscription is behind and no cursor reader was given")

// detach gives st a cursor in state: the record stops counting it live,
// its events in hand stop holding the floor back (the cursor covers
// them, R4: position writes the cursor key before the record), an
// unordered one's cursor lists what it settled above the floor, and its
// events waiting for a send slot are dropped: its reads bring them back,
// from the floor or from below the first of them, whichever is lower.
// That first one may lie below the floor: a subscription joining again
// (live from the head its reads reached, its cursor kept until what they
// brought settled) holds those events uncounted, and the floor passes
// them. Its sends running, and an ordered one's lanes, go on; their
// settlements go to the cursor.
func (p *Partition) detach(st *subState, state string) {
	name := st.m.Name
	if !p.pos.Detach(name, state) {
		p.pos.EditCursor(name, func(c *position.Cursor) { c.State = state })
	}
	if !st.m.Ordered {
		if above := p.win.SettledBy(st.m.Takes, st.inHand); len(above) > 0 {
			p.pos.EditCursor(name, func(c *position.Cursor) { c.Above = append(c.Above, above...) })
		}
	}
	for seq, counted := range st.inHand {
		if counted {
			p.win.Done(seq)
			st.inHand[seq] = false
		}
	}
	read := p.floor
	for _, ev := range st.queue {
		delete(st.inHand, ev.Seq)
		read = min(read, ev.Seq-1)
	}
	st.queue = nil
	st.state, st.read, st.joining = state, read, 0
	p.mark(st)
	p.raise()
	p.cfg.Logger.Info("the subscription left the shared read: it has a cursor", slog.Int("partition", p.cfg.Partition),
		slog.String("subscription", name), slog.String("state", state), slog.Uint64("from", read))
}

// SetState tells the partition what stops subscription sub: StatePaused,
// StateDisabled, StateBreaker (a live one gets a cursor in that state,
// and reads nothing), or "" (a paused, disabled or breaker cursor goes
// back to StateBehind: CatchUp reads its events and it rejoins). It
// fails for a subscription not in the members, or an unknown state.
func (p *Partition) SetState(sub, state string) error {
	switch state {
	case "", StatePaused, StateDisabled, StateBreaker:
	default:
		return fmt.Errorf("fanout: SetState %q of %s: want \"\", %q, %q or %q", state, sub, StatePaused, StateDisabled, StateBreaker)
	}
	m, ok := p.members.Entry(sub)
	if !ok {
		return fmt.Errorf("fanout: SetState of %s: no such member", sub)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs[sub] == nil && p.awaitsJoin(m) {
		return fmt.Errorf("fanout: SetState of %s: put after the partition was made and not joined yet (Join first)", sub)
	}
	st := p.sub(m, p.head)
	switch {
	case state == "" && st.state != "" && st.state != StateBehind:
		p.pos.EditCursor(sub, func(c *position.Cursor) { c.State = StateBehind })
		st.state = StateBehind
		p.mark(st)
	case state != "" && st.state == "":
		p.detach(st, state)
	case state != "":
		p.pos.EditCursor(sub, func(c *position.Cursor) { c.State = state })
		st.state = state
		p.mark(st)
	}
	return nil
}

// Behind returns the subscriptions with a cursor on the partition, by
// name, with its state.
func (p *Partition) Behind() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for name, st := range p.subs {
		switch {
		case st.gone:
		case st.state != "":
			out[name] = st.state
		case st.joining > 0:
			out[name] = StateBehind // live again, its cursor not dropped yet
		}
	}
	for name := range p.held {
		out[name] = StateHeld
	}
	return out
}

// Forget drops subscription sub from the partition (removed from the
// members, or a stranger held and deleted since): its sends stop after
// the attempt running, it stops holding the floor, and its record
// entries (member, stream entries, asides, retries) and its cursor go
// (position.Partition.Drop: the cursor key is deleted after the next
// commit).
func (p *Partition) Forget(sub string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, sub)
	maps.DeleteFunc(p.asides, func(k [2]string, _ *aside) bool { return k[0] == sub })
	maps.DeleteFunc(p.retries, func(k retryKey, _ uint64) bool { return k.sub == sub })
	p.refetch = slices.DeleteFunc(p.refetch, func(k retryKey) bool { return k.sub == sub })
	p.nretries.Store(int64(len(p.retries)))
	delete(p.curs, sub)
	st := p.subs[sub]
	if st == nil {
		p.pos.Drop(sub)
		return
	}
	st.gone = true
	for seq, counted := range st.inHand {
		if counted {
			p.win.Done(seq)
		}
	}
	clear(st.inHand)
	st.queue = nil
	delete(p.subs, sub)
	p.pos.Drop(sub)
	p.raise()
}

// CatchUp runs one round of the cursors in StateBehind: for each, in
// name order, it reads the subscription's events of the partition above
// what it read, up to the head (at most what it may still hold), hands
// those it has not settled to its lanes or sends, and, once its reads
// reached the head with nothing in hand, makes it live again
// (position.Partition.Rejoin) from the head: not before the head reached
// what its cursor says settled (position.Cursor.Top: a former owner's
// cursor may hold events above the claim's floor, an unordered one's
// Above or an ordered one's stream entries, which the record cannot
// carry for the live read to skip). The replica's dispatch loop
// calls it between live events, so the head stays where it is
// meanwhile. The streams set aside get the same round (stream cursors,
// with the operator's requests applied first: Config.Requests). It
// returns how many subscriptions still have a cursor (in any state) plus
// the streams set aside that read or wait for their head (not the
// parked ones), and the reads' errors (ErrNoCursorReader when there is
// no reader); a read that failed is read again next round.
func (p *Partition) CatchUp(ctx context.Context) (int, error) {
	// The dispatch loop calls it before every live event, for every
	// partition: with no cursor, aside or refetch there is nothing to
	// read (and no operator's request to apply: they apply to asides).
	p.mu.Lock()
	idle := len(p.watch) == 0 && len(p.asides) == 0 && len(p.refetch) == 0
	p.mu.Unlock()
	if idle {
		return 0, nil
	}
	behind, head, err := p.catchUpSubs(ctx)
	n, serr := p.catchUpStreams(ctx, head)
	r, rerr := p.catchUpRetries(ctx)
	return behind + n + r, errors.Join(err, serr, rerr)
}

// catchUpSubs is CatchUp's round of the subscriptions' cursors, up to
// head (returned: the streams' round reads up to the same).
func (p *Partition) catchUpSubs(ctx context.Context) (behind int, head uint64, err error) {
	type read struct {
		st      *subState
		evs     []reader.Event
		through uint64
	}
	var reads []read
	p.mu.Lock()
	head = p.head
	var todo []*subState
	for _, name := range slices.Sorted(maps.Keys(p.watch)) {
		st := p.subs[name]
		switch {
		case st == nil || st.state == "" && (st.joining == 0 || p.rejoin(st)):
			delete(p.watch, name) // live (or gone): nothing to read
			continue
		case st.state == "" || st.state != StateBehind:
		case st.read >= head && head >= st.top:
			// Live from the head on; the cursor goes once what it read
			// is settled (at once when nothing is in hand).
			st.state, st.joining = "", head
			if p.rejoin(st) {
				continue
			}
		case st.read >= head:
			// A former owner's cursor settled events above this head
			// (the claim's floor): live now, the shared read would send
			// them again. It reads on as the head passes them.
		case len(st.inHand) < st.m.MaxInHand:
			todo = append(todo, st)
		}
		behind++
	}
	p.mu.Unlock()
	for _, st := range todo {
		if p.cursors == nil {
			return behind, head, ErrNoCursorReader
		}
		p.mu.Lock()
		r := cursor.Read{Subscription: st.m.Name, Filters: st.m.Filters, Partition: p.cfg.Partition, After: st.read, To: head,
			Max: st.m.MaxInHand - len(st.inHand)}
		p.mu.Unlock()
		evs, through, rerr := p.cursors.Read(ctx, r)
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("fanout: read the cursor of %s on partition %d: %w", r.Subscription, p.cfg.Partition, rerr))
			continue
		}
		reads = append(reads, read{st, evs, min(through, head)})
	}
	p.mu.Lock()
	defer p.unlock()
	curs := p.pos.Cursors() // after the reads: what settled meanwhile is in it, or still in hand
	for _, r := range reads {
		st, c := r.st, curs[r.st.m.Name]
		if st.state != StateBehind || st.gone {
			continue
		}
		for _, ev := range r.evs {
			stream := wire.StreamKey(ev.Subject)
			if _, held := st.inHand[ev.Seq]; held || ev.Seq <= st.read || ev.Seq > head || c.Covers(stream, ev.Seq) || p.asides[[2]string{st.m.Name, stream}] != nil {
				continue
			}
			p.push(st, ev, stream, false)
		}
		st.read = max(st.read, r.through)
		// Its cursor's floor follows: everything of it read and not in
		// hand is settled, so its key stays small (Above, entries).
		f := st.read
		for seq := range st.inHand {
			f = min(f, seq-1)
		}
		if f > c.Floor {
			p.pos.EditCursor(st.m.Name, func(c *position.Cursor) { c.Floor = max(c.Floor, f) })
		}
		if st.read >= head && head >= st.top { // live from the head on
			st.state, st.joining = "", head
			p.rejoin(st)
		}
	}
	return behind, head, err
}

// mark adds st to the subscriptions CatchUp's round goes over when it
// has a cursor (a state, or joining). p.mu is held.
func (p *Partition) mark(st *subState) {
	if st.state != "" || st.joining != 0 {
		p.watch[st.m.Name] = struct{}{}
	}
}

// rejoin drops the cursor of st, live again from st.joining, once it
// holds none of the events its reads brought (those at or below
// st.joining, all settled then), and reports whether it did: the
// cursor's floor goes to st.joining, or to the partition's floor when
// that rose past it (its live events below it are settled: they held
// it back), and the record lists st as a member from there, with the
// cursor's stream entries as its own.
func (p *Partition) rejoin(st *subState) bool {
	for seq := range st.inHand {
		if seq <= st.joining {
			return false
		}
	}
	head := max(st.joining, p.floor)
	p.pos.EditCursor(st.m.Name, func(c *position.Cursor) { c.Floor = max(c.Floor, head) })
	if !p.pos.Rejoin(st.m.Name) {
		return false
	}
	st.joining, st.read, st.top = 0, 0, 0
	p.dropCursor(st.m.Name) // its reads are over
	p.cfg.Logger.Info("the subscription caught up and rejoined the shared read", slog.Int("partition", p.cfg.Partition),
		slog.String("subscription", st.m.Name), slog.Uint64("from", head))
	return true
}
