package fanout

import (
	"fmt"
	"log/slog"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// Join starts subscription sub, put in the member index, on the partition
// with a start position (docs/design/next-engine.md, section 3,
// "Replay, dead letters, start positions"): it receives the partition's
// events after the sequence after (0: from the events stream's first).
// When after is below the partition's head it starts as a StateBehind
// cursor from after (position.Partition.StartCursor: its key holds the start,
// so an owner taking over reads from there too), which CatchUp reads and
// rejoins live as any cursor; at or above the head it joins live at
// once, from after (the record lists it as a member from after, and the
// events up to after are not sent to it).
//
// A name put in the member index after the Partition was made is not
// dispatched to until its Join, so the start cannot be overtaken by a
// live event. Join is idempotent: a subscription the record lists, one
// with a cursor, or one the partition already started (an earlier Join,
// or a member the partition took live at its first event) is left as it
// is, so that an owner taking the partition over never starts a
// subscription again from its start. Errors: sub not in the member index, or
// the fan-out closed.
func (p *Partition) Join(sub string, after uint64) error {
	m, ok := p.members.Entry(sub)
	if !ok {
		return fmt.Errorf("fanout: Join of %s: no such member", sub)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return fmt.Errorf("fanout: Join of %s on partition %d: the fan-out is closed", sub, p.cfg.Partition)
	}
	if p.subs[sub] != nil {
		return nil
	}
	if _, isMember := p.claimed.Members[sub]; isMember {
		return nil // live under a former owner: its first event makes its state
	}
	if _, behind := p.curs[sub]; behind {
		p.sub(m, p.head)
		return nil
	}
	st := &subState{m: m, inHand: map[uint64]bool{}}
	if after >= p.head {
		st.from = after
		p.pos.Edit(func(r *position.Record) { r.Members[sub] = after })
		p.subs[sub] = st
		p.cfg.Logger.Info("the subscription joined the partition live", slog.Int("partition", p.cfg.Partition),
			slog.String("subscription", sub), slog.Uint64("after", after))
		return nil
	}
	if !p.pos.StartCursor(sub, StateBehind, after) {
		// The record or a cursor has it after all (written since the
		// claim by this owner): its first event makes its state.
		return nil
	}
	st.state, st.read = StateBehind, after
	p.curs[sub] = position.Cursor{State: StateBehind, Floor: after} // its chain: nothing of the record's is its
	p.subs[sub] = st
	p.mark(st)
	p.cfg.Logger.Info("the subscription joined the partition behind: it reads from its start", slog.Int("partition", p.cfg.Partition),
		slog.String("subscription", sub), slog.Uint64("after", after), slog.Uint64("head", p.head))
	return nil
}

// awaitsJoin reports whether m, which the partition has not started, was
// put in the member index after the partition was made and is neither in the
// record nor with a cursor: it is not dispatched to until Join.
func (p *Partition) awaitsJoin(m *member.Entry) bool {
	if m.Gen <= p.gen {
		return false
	}
	_, isMember := p.claimed.Members[m.Name]
	_, behind := p.curs[m.Name]
	return !isMember && !behind
}
