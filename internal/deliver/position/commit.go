package position

// The commit loop: Run's lingering and coalescing (due), the commits
// themselves (compare-and-set on the record, cursor keys before it), and
// what a refused write reads to tell its own landed write from a new
// owner's.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
)

func (p *Partition) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// due decides whether a commit goes now: something changed since the last
// one began, and a waiter wants it or it lingered linger since the first
// change. Otherwise it says how long until it does (0: nothing to commit).
func due(now, since time.Time, dirty, waiting bool, linger time.Duration) (bool, time.Duration) {
	if !dirty {
		return false, 0
	}
	if left := linger - now.Sub(since); left > 0 && !waiting {
		return false, left
	}
	return true, 0
}

// Run commits the record (and the cursors) whenever it is due, until ctx
// ends or Stop; then it commits what is left once and returns. A failed
// commit is retried after a pause (0.5 s doubling to 15 s, on
// Config.Clock), its waiters waiting. It returns ErrLost as soon as a
// commit found the record claimed by another owner, or the final
// commit's error; once the partition ended (ErrLost, or a run stopped),
// the next run returns that at once. As it starts, it also purges,
// beside the commits, the partition's members keys that no record names
// (a former owner's commit whose record never landed). Run is the
// foreground form of Start (lifecycle.Service.Run): ErrAlreadyStarted
// while it runs.
func (p *Partition) Run(ctx context.Context) error { return p.Service.Run(ctx, nil, p.commits) }

// Start runs the commits (Run) in the background until Stop, or until
// they end on their own (ErrLost): Stopped is then closed and Err says
// why (lifecycle.Part). It returns nil. Stop ends the commits (what is
// left is committed once) and returns once they ended.
func (p *Partition) Start(ctx context.Context) error { return p.Service.Start(ctx, nil, p.commits) }

// commits is Run's loop.
func (p *Partition) commits(ctx context.Context) error {
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	if end != nil {
		return end
	}
	dropped := make(chan struct{})
	go func() { // beside the commits, not in the claim's way
		defer close(dropped)
		if err := p.dropStaleMembers(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Warn("listing the members keys no record names failed; the next claim drops them", slog.Int("partition", p.cfg.Partition), slog.Any("error", err))
		}
	}()
	defer func() { <-dropped }()
	var pause backoff.Backoff
	var retryAt time.Time
	for {
		if ctx.Err() != nil {
			return p.stop(ctx)
		}
		p.mu.Lock()
		now := p.cfg.Clock.Now()
		commitNow, wait := due(now, p.since, p.dirty, len(p.waiters) > 0, p.cfg.Linger)
		p.mu.Unlock()
		if commitNow && now.Before(retryAt) {
			commitNow, wait = false, retryAt.Sub(now)
		}
		if commitNow {
			switch err := p.commit(ctx); {
			case err == nil:
				pause, retryAt = backoff.Backoff{}, time.Time{}
			case errors.Is(err, ErrLost):
				return err
			default:
				d := pause.Next()
				p.cfg.Logger.Warn("committing the partition's position failed; retrying", slog.Int("partition", p.cfg.Partition), slog.Duration("retry_in", d), slog.Any("error", err))
				retryAt = now.Add(d)
			}
			continue
		}
		var timer clockwork.Timer
		var tick <-chan time.Time
		if wait > 0 {
			timer = p.cfg.Clock.NewTimer(wait)
			tick = timer.Chan()
		}
		select {
		case <-ctx.Done():
			return p.stop(ctx)
		case <-p.kick:
		case <-tick:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// stop commits what is left and ends the partition's waiters.
func (p *Partition) stop(ctx context.Context) error {
	p.mu.Lock()
	dirty := p.dirty
	p.mu.Unlock()
	var err error
	if dirty {
		err = p.commit(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end == nil {
		p.endLocked(errStopped)
	}
	return err
}

// endLocked ends every waiter with err, and every later Wait.
func (p *Partition) endLocked(err error) {
	p.end = err
	for _, w := range p.waiters {
		w.err = err
		close(w.done)
	}
	p.waiters = nil
}

// commit writes the dirty cursor keys, then the record, then deletes the
// rejoined cursors' keys, and releases the waiters the stored state
// covers. Over the size cap, the subscriptions with the most entries of
// their own are given cursors first.
func (p *Partition) commit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	p.mu.Lock()
	if p.end != nil {
		p.mu.Unlock()
		return p.end
	}
	f, err := p.st.fit(p.cfg.MaxSize, func() string {
		p.keys++
		return MembersKey(p.cfg.Partition, p.token, p.keys)
	})
	val, detached, base := f.val, f.detached, f.base
	for _, sub := range detached {
		p.cfg.Logger.Info("the position record is over its size cap: gave the subscription with the most entries a cursor",
			slog.Int("partition", p.cfg.Partition), slog.String("subscription", sub), slog.Int("max_bytes", p.cfg.MaxSize))
	}
	p.made = append(p.made, detached...)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	snap, rev := f.stored, p.rev
	type write struct {
		sub  string
		ck   *cursorKey
		snap Cursor
		rev  uint64
	}
	var writes, deletes []write
	for sub, ck := range p.st.cursors {
		switch {
		case ck.gone && ck.rev > 0:
			deletes = append(deletes, write{sub: sub, ck: ck, rev: ck.rev})
		case ck.gone:
			delete(p.st.cursors, sub) // never written
		case ck.dirty:
			ck.c.Normalise()
			writes = append(writes, write{sub, ck, ck.c.Clone(), ck.rev})
			ck.dirty = false
		}
	}
	p.dirty = false
	p.begun++
	n := p.begun
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.ended++
		p.mu.Unlock()
	}()

	written := 0 // cursor keys written
	for ; written < len(writes); written++ {
		w := &writes[written]
		var n uint64
		if n, err = p.putCursor(ctx, w.sub, w.snap.Encode(), w.rev); err != nil {
			break
		}
		w.rev = n
	}
	if err == nil && f.newBase {
		// Before the record that names it; a key is written once, under
		// a name of this claim's, so no other writer can change it.
		if _, err = p.kv.Put(ctx, base.Key, base.Encode()); err == nil {
			p.mu.Lock()
			if old := p.st.base; old != nil {
				p.stale = append(p.stale, old.Key)
			}
			p.st.base = base
			p.mu.Unlock()
		}
	}
	if err == nil {
		rev, err = p.putRecord(ctx, val, rev)
	}
	p.mu.Lock()
	for _, w := range writes[:written] {
		// The key moved: the next write goes from its revision. What it
		// holds counts (covered) only once the record that fences it
		// landed too: a new owner reads the record of before.
		w.ck.rev = w.rev
		if err == nil {
			w.ck.stored = w.snap
		}
	}
	if err != nil {
		if !p.dirty {
			p.dirty, p.since = true, p.cfg.Clock.Now()
		}
		for _, w := range writes {
			w.ck.dirty = true
		}
		if errors.Is(err, ErrLost) {
			p.endLocked(err)
			p.cfg.Logger.Warn("the partition's position record was claimed by another owner: nothing more is committed", slog.Int("partition", p.cfg.Partition), slog.Any("error", err))
		}
		p.mu.Unlock()
		return err
	}
	p.stored, p.rev = snap, rev
	kept := p.waiters[:0]
	for _, w := range p.waiters {
		if w.flush && w.after < n || !w.flush && p.st.covered(&p.stored, w.sub, w.stream, w.seq) {
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	clear(p.waiters[len(kept):])
	p.waiters = kept
	made, stale := p.made, p.stale
	p.made, p.stale = nil, nil
	p.mu.Unlock()

	for _, key := range stale {
		p.dropMembersKey(ctx, nil, key) // the record that landed names a later key
	}

	for _, d := range deletes {
		if err := p.kv.Delete(ctx, CursorKey(d.sub, p.cfg.Partition), jetstream.LastRevision(d.rev)); err != nil {
			p.cfg.Logger.Warn("deleting a rejoined subscription's cursor key failed; the next claim drops it", slog.String("subscription", d.sub), slog.Any("error", err))
		}
		p.mu.Lock()
		if p.st.cursors[d.sub] == d.ck {
			delete(p.st.cursors, d.sub)
		}
		p.mu.Unlock()
	}
	for _, sub := range made {
		if p.cfg.CursorMade != nil {
			p.cfg.CursorMade(sub)
		}
	}
	return nil
}

// putRecord writes the record at revision rev. A refusal is read from the
// bucket's stream leader: a record still carrying this claim's token
// means an earlier write of ours landed with its answer lost, or the
// server refused spuriously; the write goes again from the revision found.
func (p *Partition) putRecord(ctx context.Context, val []byte, rev uint64) (uint64, error) {
	n, err := p.kv.Update(ctx, p.key, val, rev)
	if !casLost(err) {
		return n, err
	}
	if rev, err = p.stillOurs(ctx); err != nil {
		return 0, err
	}
	p.cfg.Logger.Info("the position record moved under this owner's own token (a write whose answer was lost landed); writing again from its revision",
		slog.Int("partition", p.cfg.Partition), slog.Uint64("revision", rev))
	return p.kv.Update(ctx, p.key, val, rev)
}

// putCursor writes sub's cursor key at revision rev (0: creates it). A
// refusal means someone else wrote the key: while the record is still
// ours, that was a former owner writing late (nothing it wrote after our
// claim was relied on), and it is written over.
func (p *Partition) putCursor(ctx context.Context, sub string, val []byte, rev uint64) (uint64, error) {
	key := CursorKey(sub, p.cfg.Partition)
	for range 3 {
		var n uint64
		var err error
		if rev == 0 {
			n, err = p.kv.Create(ctx, key, val)
		} else {
			n, err = p.kv.Update(ctx, key, val, rev)
		}
		if !casLost(err) {
			return n, err
		}
		if _, err := p.stillOurs(ctx); err != nil {
			return 0, err
		}
		if _, rev, err = leaderGet(ctx, p.js, p.kv.Bucket(), key); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("position: cursor key %q of bucket %q changed at every try", key, p.kv.Bucket())
}

// stillOurs reads the record from the bucket's stream leader and returns
// its revision when it carries this claim's token, else ErrLost.
func (p *Partition) stillOurs(ctx context.Context) (uint64, error) {
	b, rev, err := leaderGet(ctx, p.js, p.kv.Bucket(), p.key)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return 0, fmt.Errorf("%w: %q was deleted", ErrLost, p.key)
	}
	r, _, err := record.DecodeRecordRef(b)
	if err != nil || r.Claim != p.token {
		return 0, fmt.Errorf("%w: %q is now %q's (epoch %d)", ErrLost, p.key, r.Owner, r.Epoch)
	}
	return rev, nil
}
