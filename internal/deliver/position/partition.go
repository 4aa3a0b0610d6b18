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

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrLost is returned by a commit, Wait and Run once another claim
	// wrote the record (or by Claim when the record was written under a
	// higher epoch): the partition is someone else's, and this owner must
	// send and write nothing more for it.
	ErrLost = errors.New("position: the partition's record was claimed by another owner")
	// errStopped is returned by Wait once Run ended (its context was
	// cancelled) without a commit covering the settlement waited for.
	errStopped = errors.New("position: the partition's commit loop stopped")
	// errContended is returned by Claim when its compare-and-set lost to
	// another writer at every one of its tries.
	errContended = errors.New("position: the record changed at every try of the claim")
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
	// MaxSize caps the encoded record, in bytes. Default 256 KiB;
	// below 1 KiB refused.
	MaxSize int
	// CursorMade, when set, is called (outside any lock) with each
	// subscription the size cap gave a cursor, once the commit dropping
	// it from the record succeeded.
	CursorMade func(sub string)
	// Archetype is the engine's clock (the linger, the retry pauses)
	// and logger. Default base.Default.
	*base.Archetype
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
		c.MaxSize = defaultMaxSize
	}
	c.Archetype = base.Default(c.Archetype)
	return nil
}

// Partition is a claimed partition's record and cursors: what the next
// commit holds, what the last one stored, and the waiters. Its methods
// are safe for concurrent use; Run must be running for commits to
// happen.
type Partition struct {
	lifecycle.Service // the commits (commit.go): Start, Run, Stop, Err

	cfg   Config
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	key   string
	token string        // Record.Claim of this claim
	kick  chan struct{} // something changed, or a waiter came

	mu      sync.Mutex
	st      state     // what the next commit holds
	stored  storedRec // what the last successful commit (or the claim) stored
	rev     uint64    // its revision
	dirty   bool      // st changed since the last commit began
	since   time.Time
	waiters []*waiter
	made    []string // subscriptions the cap gave cursors, for CursorMade once committed
	keys    uint64   // members keys this claim wrote (the last one's number)
	stale   []string // members keys no record names once the next commit lands
	end     error    // ErrLost or errStopped: nothing more is committed
	begun   uint64   // commits begun (their snapshot taken)
	ended   uint64   // commits ended, landed or not
}

// waiter is one Wait, or one Flush (flush: released by a commit begun
// after its count of commits begun, after): done is closed when a commit
// covers it (err nil) or when no commit will (err says why).
type waiter struct {
	sub, stream string
	seq         uint64
	flush       bool
	after       uint64
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
// one saying the record changed at every try, and the bucket's.
func Claim(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, cfg Config) (*Partition, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &Partition{cfg: cfg, js: js, kv: kv, key: Key(cfg.Partition), token: rand.Text(), kick: make(chan struct{}, 1), st: state{cursors: map[string]*cursorKey{}}}
	var lastErr error // a members key gone at the last try
	for range claimTries {
		var rec Record
		var rev uint64
		p.st.base = nil
		e, err := kv.Get(ctx, p.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("position: read %q of bucket %q: %w", p.key, kv.Bucket(), err)
		default:
			var ref record.BaseRef
			if rec, ref, err = record.DecodeRecordRef(e.Value()); err != nil {
				return nil, fmt.Errorf("position: %q of bucket %q at revision %d: %w", p.key, kv.Bucket(), e.Revision(), err)
			}
			if p.st.base, err = readBase(ctx, js, kv.Bucket(), &rec, ref); err != nil {
				err = fmt.Errorf("position: %q of bucket %q at revision %d: %w", p.key, kv.Bucket(), e.Revision(), err)
				if errors.Is(err, errMembersGone) {
					// A replica behind the leader answered with a record a
					// later commit replaced, and its members key with it.
					lastErr = err
					continue
				}
				return nil, err
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
			rec, p.st.base = Record{}, nil
		}
		rec.Owner, rec.Claim, rec.Epoch, rec.Created = cfg.Owner, p.token, cfg.Epoch, created
		rec.Normalise()
		if rev == 0 {
			rev, err = kv.Create(ctx, p.key, rec.EncodeOn(p.st.base))
		} else {
			rev, err = kv.Update(ctx, p.key, rec.EncodeOn(p.st.base), rev)
		}
		if casLost(err) {
			lastErr = nil
			continue // a former owner wrote meanwhile: read it again
		}
		if err != nil {
			return nil, fmt.Errorf("position: claim %q of bucket %q: %w", p.key, kv.Bucket(), err)
		}
		p.st.rec, p.stored, p.rev = rec, storedRec{Record: rec.Clone()}, rev
		if err := p.loadCursors(ctx, reset); err != nil {
			return nil, err
		}
		return p, nil
	}
	if lastErr != nil {
		return nil, lastErr
	}
	return nil, fmt.Errorf("%w (%q of bucket %q, %d tries)", errContended, p.key, kv.Bucket(), claimTries)
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
		c, err := record.DecodeCursor(val)
		if err != nil {
			return fmt.Errorf("position: %q of bucket %q at revision %d: %w", key, bucket, rev, err)
		}
		p.st.cursors[sub] = &cursorKey{c: c, stored: c.Clone(), rev: rev}
	}
	return nil
}

// Record returns a copy of what the next commit will hold (after a claim:
// what the former owners committed, as this owner's).
func (p *Partition) Record() Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.rec.Clone()
}

// Cursors returns a copy of the partition's cursors by subscription: those
// loaded by the claim and those made since, without the rejoined ones.
func (p *Partition) Cursors() map[string]Cursor {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Cursor, len(p.st.cursors))
	for sub, ck := range p.st.cursors {
		if !ck.gone {
			out[sub] = ck.c.Clone()
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

// StartCursor gives subscription sub, which is neither a member of the record
// nor has a cursor, a cursor in state whose Floor is floor and which
// holds nothing settled above it: a subscription new on the partition
// that reads its events from floor+1 (a start position, the design's
// section 3), whatever the record's floor. It reports whether it did.
// Unlike Detach followed by EditCursor, no commit can store the cursor
// from the record's floor in between (an owner taking over from that
// would skip the events below it). Until the cursor key is written, Wait
// counts nothing of sub settled.
func (p *Partition) StartCursor(sub, state string, floor uint64) bool {
	return p.change(func() bool { return p.st.start(sub, state, floor) })
}

// Rejoin makes subscription sub live again and reports whether it did:
// the caller calls it once every event of sub at or below its cursor's
// Floor is settled and the shared read goes on above it. The record lists
// sub as a member from the cursor's Floor (Record.Covers counts it
// settled up to there) with the cursor's stream entries as its own; the
// cursor key is deleted after the commit that lists it. It does nothing
// when sub has no cursor, when the cursor's Floor is below the record's
// (the record's floor would count sub's unsettled events settled), or
// when its Above holds events above its Floor (an unordered
// subscription's: the record has no place for them, and the shared read
// would send them again; the caller rejoins from Cursor.Top).
func (p *Partition) Rejoin(sub string) bool {
	return p.change(func() bool { return p.st.rejoin(sub) })
}

// Drop forgets subscription sub on the partition: its member entry, its
// stream entries, its asides and retries entries go from the record, and
// its cursor, if any, is dropped (its key is deleted after the next
// commit, as a rejoined one's). It reports whether the record or a
// cursor held anything of sub. For a subscription deleted for good: the
// floor never waits for it again and nothing of it is kept.
func (p *Partition) Drop(sub string) bool {
	return p.change(func() bool { return p.st.drop(sub) })
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

// Flush returns nil once a commit holding every change made before the
// call succeeded (at once when nothing changed since the last commit
// and none is under way); it makes that commit go without lingering. A
// change whose effect is outside the bucket waits for it: a request
// applied to the record is deleted only then. Errors: ErrLost, one
// saying Run ended (errStopped), or ctx's.
func (p *Partition) Flush(ctx context.Context) error {
	p.mu.Lock()
	if !p.dirty && p.begun == p.ended {
		p.mu.Unlock()
		return nil
	}
	after := p.begun // a commit begun after this one holds the changes
	if !p.dirty {
		after-- // the one under way holds them
	}
	return p.await(ctx, &waiter{flush: true, after: after, done: make(chan struct{})})
}

// Wait returns nil once a commit holding the settlement of the event at
// seq of stream by subscription sub succeeded (at once when the last one
// did); a waiter makes the next commit go without lingering. Errors:
// ErrLost, one saying Run ended (errStopped), or ctx's.
func (p *Partition) Wait(ctx context.Context, sub, stream string, seq uint64) error {
	w := &waiter{sub: sub, stream: stream, seq: seq, done: make(chan struct{})}
	p.mu.Lock()
	if p.st.covered(&p.stored, sub, stream, seq) {
		p.mu.Unlock()
		return nil
	}
	return p.await(ctx, w)
}

// await waits for w, called with the lock held (it unlocks).
func (p *Partition) await(ctx context.Context, w *waiter) error {
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
