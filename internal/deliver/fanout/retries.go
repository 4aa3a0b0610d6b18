package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// The record's retries entries (docs/design/next-engine.md, R1 and the
// table "Where each subscription's position lives"): an event whose
// attempt failed is recorded with its attempt count, with the commit
// after each failure, and its entry goes when it settles. A new owner
// goes on counting from there. For an unordered subscription the entry
// also covers the event, so the floor passes it at its first failure:
// one event retried for hours neither holds every subscription's floor
// back nor keeps the floor's window growing behind it; a new owner
// fetches it by its sequence (CatchUp, through the CursorReader) and
// retries it. An ordered head holds the floor until it settles or its
// stream is set aside (the stuck-stream rule), so its entry carries only
// its count.

// retryKey is one retried event of one subscription.
type retryKey struct {
	sub string
	seq uint64
}

// firstAttempt is the number of the next attempt at the event at seq of
// subscription sub: 1, or one past the attempts its retries entry
// counts.
func (p *Partition) firstAttempt(sub string, seq uint64) int {
	if p.nretries.Load() == 0 {
		return 1 // no entry: no lock taken on the way of every event
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return int(p.retries[retryKey{sub, seq}]) + 1
}

// retrying records that an attempt at st's event at seq failed, n
// attempts having spent one of MaxDeliver (Settlement.Spent); an
// unordered subscription's event stops holding the floor back.
func (p *Partition) retrying(st *subState, sub string, seq uint64, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st.gone {
		return
	}
	p.retries[retryKey{sub, seq}] = uint64(n)
	p.nretries.Store(int64(len(p.retries)))
	p.recordRetry(sub, seq, uint64(n))
	if counted := st.inHand[seq]; counted && !st.m.Ordered {
		st.inHand[seq] = false // its entry covers it (in the same record as the floor it lets rise)
		p.win.Done(seq)
		p.raise()
	}
}

// recordRetry sets the record's retries entry of sub's event at seq
// (position.Retry) to attempts, adding it when the record has none.
func (p *Partition) recordRetry(sub string, seq, attempts uint64) {
	p.pos.Edit(func(r *position.Record) {
		i := slices.IndexFunc(r.Retries, func(e position.Retry) bool { return e.Sub == sub && e.Seq == seq })
		if i < 0 {
			r.Retries = append(r.Retries, position.Retry{Sub: sub, Seq: seq})
			i = len(r.Retries) - 1
		}
		r.Retries[i].Attempts = attempts
	})
}

// dropRetry drops the retries entry of sub's event at seq, if it has
// one: it settled. Called with the lock held.
func (p *Partition) dropRetry(sub string, seq uint64) {
	k := retryKey{sub, seq}
	if _, ok := p.retries[k]; !ok {
		return
	}
	delete(p.retries, k)
	p.nretries.Store(int64(len(p.retries)))
	p.pos.Edit(func(r *position.Record) {
		r.Retries = slices.DeleteFunc(r.Retries, func(e position.Retry) bool { return e.Sub == sub && e.Seq == seq })
	})
}

// catchUpRetries fetches the events of the retries entries a former
// owner left for unordered subscriptions (below the floor: the reads
// pass them) by their sequence, and hands each to its subscription's
// sends. It returns how many are still to fetch.
func (p *Partition) catchUpRetries(ctx context.Context) (int, error) {
	p.mu.Lock()
	todo := slices.Clone(p.refetch)
	p.mu.Unlock()
	if len(todo) == 0 {
		return 0, nil
	}
	if p.cursors == nil {
		return len(todo), ErrNoCursorReader
	}
	var err error
	for _, k := range todo {
		m, ok := p.members.Entry(k.sub)
		if !ok {
			continue // not a member (yet): left for later
		}
		evs, through, rerr := p.cursors.Read(ctx, cursor.Read{Subscription: k.sub, Filters: m.Filters, Partition: p.cfg.Partition,
			After: k.seq - 1, To: k.seq, Max: 1})
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("fanout: fetch event %d of %s on partition %d: %w", k.seq, k.sub, p.cfg.Partition, rerr))
			continue
		}
		p.mu.Lock()
		p.refetch = slices.DeleteFunc(p.refetch, func(x retryKey) bool { return x == k })
		st := p.sub(m, p.head)
		switch {
		case len(evs) == 1 && evs[0].Seq == k.seq:
			if _, held := st.inHand[k.seq]; !held {
				p.push(st, evs[0], wire.StreamKey(evs[0].Subject), false)
			}
		case through >= k.seq:
			// Gone from the events stream (retention): nothing to retry.
			p.dropRetry(k.sub, k.seq)
			p.cfg.Logger.Warn("an event in retry is no longer in the events stream: its retries entry is dropped",
				slog.Int("partition", p.cfg.Partition), slog.String("subscription", k.sub), slog.Uint64("seq", k.seq))
		default:
			p.refetch = append(p.refetch, k) // a short answer: again next round
		}
		live := st.state == ""
		p.unlock()
		if live {
			p.dropCursor(k.sub) // the fetch's cursor (one with a cursor of its own rereads it)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.refetch), err
}

// loadRetries reads the claim's retries entries: their counts, and the
// unordered subscriptions' events to fetch.
func (p *Partition) loadRetries() {
	for _, e := range p.claimed.Retries {
		p.retries[retryKey{e.Sub, e.Seq}] = e.Attempts
		p.nretries.Store(int64(len(p.retries)))
		if m, ok := p.members.Entry(e.Sub); ok && !m.Ordered && e.Seq > 0 {
			p.refetch = append(p.refetch, retryKey{e.Sub, e.Seq})
		}
	}
}

// retryHolesLocked gives, at Close, every event an unordered
// subscription holds unsettled below one it settled a retries entry (its
// count so far, 0 when no attempt failed): it stops holding the floor
// back, the commit after Close raises the floor past the events settled
// above it, and the next owner fetches and sends the unsettled ones
// alone, not every event settled above the first of them again (the
// record keeps no entry per unordered event). Called with the lock held,
// once every send ended; not after the record was lost.
func (p *Partition) retryHolesLocked() {
	if p.err != nil {
		return
	}
	for name, st := range p.subs {
		if st.m.Ordered || st.gone || st.state != "" {
			continue
		}
		for seq, counted := range st.inHand {
			if !counted || seq > st.high {
				continue
			}
			n := p.retries[retryKey{name, seq}]
			p.retries[retryKey{name, seq}] = n
			p.recordRetry(name, seq, n) // in memory and in the record alike: n, or a new entry
			st.inHand[seq] = false
			p.win.Done(seq)
		}
	}
	p.nretries.Store(int64(len(p.retries)))
	p.raise()
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
