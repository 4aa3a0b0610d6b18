package deliver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/wire"
)

// The delivered record (docs/ordering.md, "The delivered record"). A
// partition's lanes settle their streams' events out of order (one lane
// per stream), so the partition consumer's ack floor says little about
// what a former owner delivered: an event acked above it never comes
// back. The record says it: per stream, the sequence (in the partitioned
// copy) of the last event the partition's owners answered 2xx or
// dead-lettered, kept for the streams above the ack floor. It lives in
// the park bucket (wire.DeliveredKey; no TTL, so a dead owner's lease
// expiring does not take it along).
//
// Invariants:
//   - an owner acks an event only once a write of the record covering it
//     succeeded, and a lane sends a stream's next event only then: every
//     acked event is at or below the ack floor or at or below its
//     stream's entry, and so is every event whose successor was sent;
//   - every write is a compare-and-set on the revision the owner last
//     wrote or read, and a new owner writes the record (claim) before it
//     pulls: from then on a former owner's writes fail, so it acks
//     nothing more (its partition stops at once), and whatever it wrote
//     before, the new owner read.
//
// So a new owner hands a stream's first event on at once when its
// predecessor is at or below the floor or its stream's entry; any other
// predecessor was never acked, is pending on the consumer and comes (it
// waits for it, with no timeout). A copy of an event at or below its
// stream's entry was delivered: it is acked without a POST.

// deliveredDoc is the record as stored (JSON), spelled once in wire:
// `consumer trace` reads it too.
type deliveredDoc = wire.DeliveredRecord

// errRecordLost is why an ack was not sent: a write of the delivered
// record found it written by another replica, which owns the partition
// now.
var errRecordLost = errors.New("the partition's delivered record was written by another replica (the lease is lost)")

// recordWrite is one write of the record: done is closed when it ended,
// err says how (nil: written).
type recordWrite struct {
	done chan struct{}
	err  error
}

// writtenAlready is a write that needs no waiting (no bucket).
var writtenAlready = func() *recordWrite { w := &recordWrite{done: make(chan struct{})}; close(w.done); return w }()

// deliveredRecord is one owned partition's delivered record.
type deliveredRecord struct {
	kv         jetstream.KeyValue // the park bucket; nil: nothing is written (settle returns at once)
	key        string             // wire.DeliveredKey
	owner      string
	claimToken string // deliveredDoc.Claim of this claim's writes
	copy       int64  // the copy's creation time (deliveredDoc.Copy)
	clock      clockwork.Clock
	log        *slog.Logger
	// floor returns the partition consumer's ack floor as last read:
	// entries at or below it are dropped from the next write.
	floor func() uint64
	// lost is called once when a write found the record taken: the
	// partition stops (its lease is lost).
	lost func()

	kick chan struct{} // a write is wanted

	mu        sync.Mutex
	rev       uint64            // the revision last written or read
	inherited map[string]uint64 // the former owners' entries, read at claim
	entries   map[string]uint64 // what the next write holds: inherited and this owner's
	next      *recordWrite      // the next write, when one is wanted
	isLost    bool
}

func newDeliveredRecord(kv jetstream.KeyValue, key, owner string, copyCreated time.Time, clock clockwork.Clock, log *slog.Logger) *deliveredRecord {
	return &deliveredRecord{
		kv: kv, key: key, owner: owner, claimToken: rand.Text(), copy: copyCreated.UnixNano(), clock: clock, log: log,
		floor: func() uint64 { return 0 }, lost: func() {},
		kick: make(chan struct{}, 1), inherited: map[string]uint64{}, entries: map[string]uint64{},
	}
}

// claimTries bounds the compare-and-set rounds of a claim, as the lease
// epoch's (owner.Epochs): each failed round means another writer wrote
// the record meanwhile.
const claimTries = 20

// claim reads the record the former owners wrote and writes it back as
// this replica's (compare-and-set): from then on their writes fail. A
// record of another copy, or one that cannot be parsed, is dropped
// (logged): its streams wait for what is pending, as with no record.
func (r *deliveredRecord) claim(ctx context.Context) error {
	for range claimTries {
		e, err := r.kv.Get(ctx, r.key)
		var rev uint64
		var doc deliveredDoc
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("deliver: read the delivered record (key %q of bucket %q): %w", r.key, r.kv.Bucket(), err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &doc); err != nil {
				r.log.Warn("the partition's delivered record cannot be read; going without it", slog.String("key", r.key), slog.Any("error", err))
				doc = deliveredDoc{}
			} else if doc.Copy != r.copy {
				doc.Streams = nil // sequences of a copy that was deleted
			}
		}
		doc.Owner, doc.Copy, doc.Claim = r.owner, r.copy, r.claimToken
		val, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		if rev == 0 {
			rev, err = r.kv.Create(ctx, r.key, val)
		} else {
			rev, err = r.kv.Update(ctx, r.key, val, rev)
		}
		if owner.RevisionLost(err) {
			continue // a former owner wrote meanwhile: read it again
		}
		if err != nil {
			return fmt.Errorf("deliver: write the delivered record (key %q of bucket %q): %w", r.key, r.kv.Bucket(), err)
		}
		r.mu.Lock()
		r.rev = rev
		for k, s := range doc.Streams {
			r.inherited[k], r.entries[k] = s, s
		}
		r.mu.Unlock()
		return nil
	}
	return fmt.Errorf("deliver: delivered record %q: %w", r.key, owner.ErrEpochContended)
}

// covers reports whether the event at seq of stream key was settled by
// a former owner (at or below its stream's entry when the partition was
// taken): a copy of it is acked without a POST.
func (r *deliveredRecord) covers(key string, seq uint64) bool {
	if r == nil || seq == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return seq <= r.inherited[key]
}

// inherit raises the inherited entries to settled (stream key → sequence
// of its last event settled, and written, by this owner) before the
// partition resets its own consumer (partition.healFence): what this
// owner settled above the ack floor comes again, and is acked without a
// POST (covers), as a former owner's is after a take-over.
func (r *deliveredRecord) inherit(settled map[string]uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, s := range settled {
		if s > r.inherited[k] {
			r.inherited[k] = s
		}
	}
}

// inheritedSeq returns stream key's entry read when the partition was
// taken (0: none).
func (r *deliveredRecord) inheritedSeq(key string) uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inherited[key]
}

// settle records the event at seq of stream key as settled and returns
// the write that will hold it; the caller waits for its done, then acks
// the event when its err is nil.
func (r *deliveredRecord) settle(key string, seq uint64) *recordWrite {
	if r == nil || r.kv == nil {
		return writtenAlready
	}
	r.mu.Lock()
	if r.isLost {
		r.mu.Unlock()
		w := &recordWrite{done: make(chan struct{}), err: errRecordLost}
		close(w.done)
		return w
	}
	if seq > r.entries[key] {
		r.entries[key] = seq
	}
	w := r.next
	if w == nil {
		w = &recordWrite{done: make(chan struct{})}
		r.next = w
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return w
}

// lostLease reports whether a write found the record taken.
func (r *deliveredRecord) lostLease() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.isLost
}

// run writes the record whenever an event was settled since the last
// write, under lease's fence, until stop is closed (once the partition's
// deliveries ended); then it writes what is left. There is no write
// interval: every settlement made while a write is on its way shares the
// next one (group commit), so a busy partition writes once for many
// events and a stream's next event waits for one write at most, and an
// idle partition writes nothing.
func (r *deliveredRecord) run(lease *leaseFence, stop <-chan struct{}) {
	if r == nil || r.kv == nil {
		return
	}
	for {
		select {
		case <-r.kick:
			r.write(lease)
		case <-stop:
			r.write(lease)
			return
		}
	}
}

// write writes the record when a write is wanted, once the lease fence
// allows an ack (a write after the lease deadline would let a late ack's
// event count as delivered while the new owner may hold it). It ends the
// write's waiters: nil when written; errLeasePassed when the partition
// was released past its deadline; errRecordLost when the record was
// taken (then the partition stops); another error for the lanes to try
// again.
func (r *deliveredRecord) write(lease *leaseFence) {
	r.mu.Lock()
	w := r.next
	r.next = nil
	if w == nil || r.isLost {
		r.mu.Unlock()
		if w != nil {
			w.err = errRecordLost
			close(w.done)
		}
		return
	}
	r.mu.Unlock()
	if !lease.waitAck() {
		w.err = errLeasePassed
		close(w.done)
		return
	}
	r.mu.Lock()
	floor := r.floor()
	for k, s := range r.entries {
		if s <= floor {
			delete(r.entries, k)
		}
	}
	doc := deliveredDoc{Owner: r.owner, Copy: r.copy, Streams: r.entries, Claim: r.claimToken}
	val, err := json.Marshal(doc)
	rev := r.rev
	r.mu.Unlock()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rev, err = r.kv.Update(ctx, r.key, val, rev)
		if owner.RevisionLost(err) {
			// Maybe an earlier write of ours landed although its
			// answer was lost (a KV leader moving): then the record is
			// still ours, at a revision we never heard of.
			var own uint64
			if own, err = r.landed(ctx, err); err == nil {
				rev, err = r.kv.Update(ctx, r.key, val, own)
			}
		}
		cancel()
	}
	r.mu.Lock()
	switch {
	case err == nil:
		r.rev = rev
	case owner.RevisionLost(err):
		r.isLost = true
		err = errRecordLost
	}
	r.mu.Unlock()
	if errors.Is(err, errRecordLost) {
		r.log.Warn("the partition's delivered record was written by another replica: its lease is lost; stopping it, nothing more is acked")
		r.lost()
	}
	w.err = err
	close(w.done)
}

// landed tells a compare-and-set write that failed (casErr) because an
// earlier write of this claim landed unanswered (a timeout, "no response
// from stream": the KV stream's leader moved or was starved) from one
// that failed because another claim wrote the record: it reads the
// record and returns its revision when the last write carries this
// claim's token (deliveredDoc.Claim), and casErr when it does not. A
// read that fails returns its error: the write is tried again, not taken
// for lost. No other claim's write ever carries the token, so a record
// found with it was not claimed since; before the token, the retry found
// the revision moved, took it for a take-over and stopped the partition
// (and nobody owned it until its lease expired).
func (r *deliveredRecord) landed(ctx context.Context, casErr error) (uint64, error) {
	e, err := r.kv.Get(ctx, r.key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, casErr
		}
		return 0, fmt.Errorf("deliver: read the delivered record after a write found its revision moved (key %q of bucket %q): %w", r.key, r.kv.Bucket(), err)
	}
	var doc deliveredDoc
	if json.Unmarshal(e.Value(), &doc) != nil || doc.Claim != r.claimToken || doc.Owner != r.owner {
		return 0, casErr
	}
	r.log.Info("a write of the partition's delivered record landed although its answer was lost; writing on from its revision", slog.Uint64("revision", e.Revision()))
	return e.Revision(), nil
}

// settleAndWait records the event at seq of stream key as settled and
// waits until a write holds it: nil when it does (the event may be
// acked), else why not. It retries a failed write with backoff, 10 tries
// at most.
func (r *deliveredRecord) settleAndWait(ctx context.Context, key string, seq uint64) error {
	var pause backoff.Backoff
	for tries := 1; ; tries++ {
		w := r.settle(key, seq)
		<-w.done
		if w.err == nil || errors.Is(w.err, errRecordLost) || errors.Is(w.err, errLeasePassed) || tries >= 10 {
			return w.err
		}
		d := pause.Next()
		r.log.Warn("writing the delivered record failed; retrying (the stream's next event waits)", slog.Any("error", w.err), slog.Duration("retry_in", d))
		sleep(ctx, r.clock, d)
	}
}
