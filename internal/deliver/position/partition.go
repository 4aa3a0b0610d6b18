package position

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
)

var (
	// ErrLost is returned by a commit, Wait and Run once another claim
	// wrote the record (or by Claim when the record was written under a
	// higher epoch): the partition is someone else's, and this owner must
	// send and write nothing more for it.
	ErrLost = errors.New("position: the partition's record was claimed by another owner")
	// ErrStopped is returned by Wait once Run ended (its context was
	// cancelled) without a commit covering the settlement waited for.
	ErrStopped = errors.New("position: the partition's commit loop stopped")
	// ErrContended is returned by Claim when its compare-and-set lost to
	// another writer at every one of its tries.
	ErrContended = errors.New("position: the record changed at every try of the claim")
)

// errTooLarge is a commit's error when the record is over Config.MaxSize
// with no subscription left ahead to give a cursor: Run logs it and tries
// again after a pause (a floor risen since shrinks the record).
var errTooLarge = errors.New("position: the record is over its size cap")

// claimTries bounds the compare-and-set rounds of a claim.
const claimTries = 20

// writeTimeout bounds one commit's key-value requests (wall clock: it
// measures I/O).
const writeTimeout = 5 * time.Second

// Config is one partition's position writer.
type Config struct {
	// Partition is the partition's number (0 or more): the record is
	// Key(Partition), the cursors CursorKey(sub, Partition).
	Partition int
	// Owner is this replica's id, written in the record. Required.
	Owner string
	// Epoch is the claim's lease epoch. A record written under a higher
	// one belongs to a later claim: Claim fails with ErrLost.
	Epoch uint64
	// Created is the events stream's creation time (its StreamInfo's
	// Created). A record written for another creation time (the stream
	// was deleted and made again, its sequences start again) is not read:
	// the claim starts from an empty record and drops the partition's
	// cursor keys, with a warning. Zero: not checked.
	Created time.Time
	// Linger is how long a settlement may wait for its commit when no
	// waiter wants it sooner. Default DefaultLinger; negative refused.
	Linger time.Duration
	// MaxSize caps the encoded record, in bytes. Default DefaultMaxSize;
	// below 1 KiB refused.
	MaxSize int
	// CursorMade, when set, is called (outside any lock) with each
	// subscription the size cap gave a cursor, once the commit dropping
	// it from the record succeeded.
	CursorMade func(sub string)
	// Clock drives the linger and the retry pauses. Default the real one.
	Clock clockwork.Clock
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	switch {
	case c.Partition < 0:
		return fmt.Errorf("position: Config.Partition %d is negative", c.Partition)
	case c.Owner == "":
		return errors.New("position: Config.Owner is empty")
	case c.Linger < 0:
		return fmt.Errorf("position: Config.Linger %s is negative", c.Linger)
	case c.MaxSize != 0 && c.MaxSize < 1024:
		return fmt.Errorf("position: Config.MaxSize %d is below 1024 bytes", c.MaxSize)
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxSize == 0 {
		c.MaxSize = DefaultMaxSize
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Partition is a claimed partition's record and cursors: what the next
// commit holds, what the last one stored, and the waiters. Its methods
// are safe for concurrent use; Run must be running for commits to
// happen.
type Partition struct {
	cfg   Config
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	key   string
	token string        // Record.Claim of this claim
	kick  chan struct{} // something changed, or a waiter came

	mu      sync.Mutex
	st      state  // what the next commit holds
	stored  Record // what the last successful commit (or the claim) stored
	rev     uint64 // its revision
	dirty   bool   // st changed since the last commit began
	since   time.Time
	waiters []*waiter
	made    []string // subscriptions the cap gave cursors, for CursorMade once committed
	end     error    // ErrLost or ErrStopped: nothing more is committed
}

// waiter is one Wait: done is closed when a commit covers it (err nil)
// or when no commit will (err says why).
type waiter struct {
	sub, stream string
	seq         uint64
	done        chan struct{}
	err         error
}

// Claim takes partition cfg.Partition's record for cfg.Owner: it reads
// the record and writes it back with a token of its own (compare-and-set;
// a write that raced it reads again), then loads the partition's cursor
// keys. From then on a former owner's commits fail with ErrLost. js is
// the client the bucket kv was opened with (a refused commit is read
// from the bucket's stream leader through it). Errors: ErrLost (the
// record carries a higher epoch), ErrCorrupt (wrapped, naming the key),
// ErrContended, and the bucket's.
func Claim(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, cfg Config) (*Partition, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &Partition{cfg: cfg, js: js, kv: kv, key: Key(cfg.Partition), token: rand.Text(), kick: make(chan struct{}, 1), st: state{cursors: map[string]*cursorKey{}}}
	for range claimTries {
		var rec Record
		var rev uint64
		e, err := kv.Get(ctx, p.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("position: read %q of bucket %q: %w", p.key, kv.Bucket(), err)
		default:
			if rec, err = decodeRecord(e.Value()); err != nil {
				return nil, fmt.Errorf("position: %q of bucket %q at revision %d: %w", p.key, kv.Bucket(), e.Revision(), err)
			}
			rev = e.Revision()
		}
		if rec.Epoch > cfg.Epoch {
			return nil, fmt.Errorf("%w: %q was written under epoch %d by %q, above this claim's %d", ErrLost, p.key, rec.Epoch, rec.Owner, cfg.Epoch)
		}
		created := rec.Created
		if !cfg.Created.IsZero() {
			created = cfg.Created.UnixNano()
		}
		reset := rec.Created != 0 && rec.Created != created
		if reset {
			cfg.Logger.Warn("the position record is of an events stream deleted since (its sequences started again): starting the partition from the new stream's start",
				slog.String("key", p.key), slog.Time("record_stream_created", time.Unix(0, rec.Created)), slog.Time("stream_created", cfg.Created))
			rec = Record{}
		}
		rec.Owner, rec.Claim, rec.Epoch, rec.Created = cfg.Owner, p.token, cfg.Epoch, created
		rec.normalise()
		if rev == 0 {
			rev, err = kv.Create(ctx, p.key, rec.encode())
		} else {
			rev, err = kv.Update(ctx, p.key, rec.encode(), rev)
		}
		if casLost(err) {
			continue // a former owner wrote meanwhile: read it again
		}
		if err != nil {
			return nil, fmt.Errorf("position: claim %q of bucket %q: %w", p.key, kv.Bucket(), err)
		}
		p.st.rec, p.stored, p.rev = rec, rec.clone(), rev
		if err := p.loadCursors(ctx, reset); err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w (%q of bucket %q, %d tries)", ErrContended, p.key, kv.Bucket(), claimTries)
}

// loadCursors reads the partition's cursor keys from the bucket's stream
// leader: the keys from a stream info filtered by subject (which only the
// leader answers; a KV listing is a consumer, which a lagging follower
// may serve), each value by a message get. A key whose subscription the
// record lists as a member is stale (its commit never landed, or a
// former owner wrote it late) and is deleted, as is every key when the
// record was reset (of an events stream deleted since).
func (p *Partition) loadCursors(ctx context.Context, reset bool) error {
	bucket := p.kv.Bucket()
	s, err := p.js.Stream(ctx, "KV_"+bucket)
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = s.Info(ctx, jetstream.WithSubjectFilter("$KV."+bucket+"."+cursorFilter(p.cfg.Partition)))
	}
	if err != nil {
		return fmt.Errorf("position: list the cursors of partition %d in bucket %q: %w", p.cfg.Partition, bucket, err)
	}
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, "$KV."+bucket+".")
		sub := strings.TrimSuffix(strings.TrimPrefix(key, "cur."), fmt.Sprintf(".p%d", p.cfg.Partition))
		val, rev, err := leaderGet(ctx, p.js, bucket, key)
		if err != nil {
			return err
		}
		if rev == 0 {
			continue // deleted
		}
		if _, member := p.st.rec.Members[sub]; member || reset {
			p.cfg.Logger.Info("dropping a stale cursor key: the record lists its subscription as live, or is of an events stream deleted since", slog.String("key", key))
			if err := p.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
				p.cfg.Logger.Warn("deleting a stale cursor key failed; the next claim drops it again", slog.String("key", key), slog.Any("error", err))
			}
			continue
		}
		c, err := decodeCursor(val)
		if err != nil {
			return fmt.Errorf("position: %q of bucket %q at revision %d: %w", key, bucket, rev, err)
		}
		p.st.cursors[sub] = &cursorKey{c: c, stored: c.clone(), rev: rev}
	}
	return nil
}

// Record returns a copy of what the next commit will hold (after a claim:
// what the former owners committed, as this owner's).
func (p *Partition) Record() Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.rec.clone()
}

// Cursors returns a copy of the partition's cursors by subscription: those
// loaded by the claim and those made since, without the rejoined ones.
func (p *Partition) Cursors() map[string]Cursor {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Cursor, len(p.st.cursors))
	for sub, ck := range p.st.cursors {
		if !ck.gone {
			out[sub] = ck.c.clone()
		}
	}
	return out
}

// Settled records that subscription sub settled the event at e.Seq
// (version e.Version) of stream: in its cursor when it has one, else as
// its own entry in the record. The commit that holds it comes within
// Config.Linger, or at once when a waiter wants it.
func (p *Partition) Settled(sub, stream string, e Entry) {
	p.change(func() bool { p.st.settled(sub, stream, e); return true })
}

// Edit changes the record's floor, shared stream entries, members,
// asides, retries or detached groups (fn gets the maps allocated; its
// changes to Owner, Claim and Epoch are undone). The caller keeps the
// rules: the floor only rises, and a subscription is dropped from
// Members by Detach, added back by Rejoin.
func (p *Partition) Edit(fn func(*Record)) {
	p.change(func() bool { p.st.edit(fn); return true })
}

// EditCursor changes subscription sub's cursor (its floor, state,
// entries, Above) and reports whether it has one.
func (p *Partition) EditCursor(sub string, fn func(*Cursor)) bool {
	return p.change(func() bool { return p.st.editCursor(sub, fn) })
}

// Detach gives subscription sub a cursor in state (see Cursor.State)
// holding what the record says it settled, and drops it from the
// record's members and entries; it reports whether it did (not when sub
// has a cursor already). The cursor key is written before the commit
// that drops it (R4); until that commit succeeded, Wait goes by the
// record.
func (p *Partition) Detach(sub, state string) bool {
	return p.change(func() bool { return p.st.detach(sub, state) })
}

// Rejoin makes subscription sub live again and reports whether it did:
// the caller calls it once every event of sub at or below its cursor's
// Floor is settled and the shared read goes on above it. The record lists
// sub as a member from the cursor's Floor (Record.Covers counts it
// settled up to there) with the cursor's stream entries as its own; the
// cursor key is deleted after the commit that lists it. It does nothing
// when sub has no cursor, or when the cursor's Floor is below the
// record's (the record's floor would count sub's unsettled events
// settled).
func (p *Partition) Rejoin(sub string) bool {
	return p.change(func() bool { return p.st.rejoin(sub) })
}

// change runs fn under the lock and, when it changed something, marks a
// commit wanted.
func (p *Partition) change(fn func() bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !fn() {
		return false
	}
	if !p.dirty {
		p.dirty, p.since = true, p.cfg.Clock.Now()
	}
	p.poke()
	return true
}

// Wait returns nil once a commit holding the settlement of the event at
// seq of stream by subscription sub succeeded (at once when the last one
// did); a waiter makes the next commit go without lingering. Errors:
// ErrLost, ErrStopped, or ctx's.
func (p *Partition) Wait(ctx context.Context, sub, stream string, seq uint64) error {
	w := &waiter{sub: sub, stream: stream, seq: seq, done: make(chan struct{})}
	p.mu.Lock()
	if p.st.covered(&p.stored, sub, stream, seq) {
		p.mu.Unlock()
		return nil
	}
	if p.end != nil {
		p.mu.Unlock()
		return p.end
	}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()
	p.poke()
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		p.mu.Lock()
		p.waiters = slices.DeleteFunc(p.waiters, func(x *waiter) bool { return x == w })
		p.mu.Unlock()
		return ctx.Err()
	}
}

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
// ends; then it commits what is left once and returns. A failed commit is
// retried after a pause (0.5 s doubling to 15 s, on Config.Clock), its
// waiters waiting. It returns ErrLost as soon as a commit found the
// record claimed by another owner, or the final commit's error.
func (p *Partition) Run(ctx context.Context) error {
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
		p.endLocked(ErrStopped)
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
	val, detached, err := p.st.fit(p.cfg.MaxSize)
	for _, sub := range detached {
		p.cfg.Logger.Info("the position record is over its size cap: gave the subscription with the most entries a cursor",
			slog.Int("partition", p.cfg.Partition), slog.String("subscription", sub), slog.Int("max_bytes", p.cfg.MaxSize))
	}
	p.made = append(p.made, detached...)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	snap, rev := p.st.rec.clone(), p.rev
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
			ck.c.normalise()
			writes = append(writes, write{sub, ck, ck.c.clone(), ck.rev})
			ck.dirty = false
		}
	}
	p.dirty = false
	p.mu.Unlock()

	written := 0 // cursor keys written
	for ; written < len(writes); written++ {
		w := &writes[written]
		var n uint64
		if n, err = p.putCursor(ctx, w.sub, w.snap.encode(), w.rev); err != nil {
			break
		}
		w.rev = n
	}
	if err == nil {
		rev, err = p.putRecord(ctx, val, rev)
	}
	p.mu.Lock()
	for _, w := range writes[:written] {
		w.ck.stored, w.ck.rev = w.snap, w.rev
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
		if p.st.covered(&p.stored, w.sub, w.stream, w.seq) {
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	clear(p.waiters[len(kept):])
	p.waiters = kept
	made := p.made
	p.made = nil
	p.mu.Unlock()

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
	r, err := decodeRecord(b)
	if err != nil || r.Claim != p.token {
		return 0, fmt.Errorf("%w: %q is now %q's (epoch %d)", ErrLost, p.key, r.Owner, r.Epoch)
	}
	return rev, nil
}
