package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// Epochs hands out the lease epochs of partition claims
// (wire.HeaderLeaseEpoch) from a counter (key wire.EpochKey) in a bucket
// that has no TTL and outlives the lease bucket: the positions bucket
// (`consumer migrate` copied the old engine's counter there, never
// lowering it).
//
// Invariant: for one partition, each claim's epoch is above every epoch
// an earlier claim of it used. A claim takes its epoch only after it
// created the partition's lease key (so claims of one partition follow
// each other), and it writes the epoch to the counter with a
// compare-and-set on the revision it read before any webhook carries
// it: a later claim reads that write or a later one (a stale read, of a
// lagging follower, fails the compare-and-set and is read again), so its
// epoch is higher. Nothing here reads a clock, and the lease bucket's
// revisions only set a floor (max with the lease's create revision), so a
// lease bucket made by `nats kv add` (first revision 1), restored from a
// backup, or created again by a replica whose clock is behind gives
// higher epochs all the same.
//
// The counter can be lost with its bucket, or a receiver may have seen
// higher epochs from another deployment: its gate then answers
// stale-epoch, and Raise lifts the counter above the epoch it names
// (wire.HeaderOrderEpoch), or doubles the refused epoch when it names
// none, before the partition is claimed again: a stream is refused for at
// most one claim per raise, never for ever.
//
// The zero Epochs (KV nil) hands out nothing; AfterStale does nothing.
type Epochs struct {
	// KV is the bucket holding the counter.
	KV jetstream.KeyValue
}

// epochTries bounds the compare-and-set rounds of Next and Raise: each
// failed round means another claim or raise wrote the counter meanwhile.
const epochTries = 20

// ErrEpochContended is returned by Next and Raise when all of their
// compare-and-set rounds (20) lost to other writers.
var ErrEpochContended = errors.New("the lease epoch counter changed at every try")

// Next returns the epoch of a claim whose lease key was created at
// revision rev: the counter plus one, at least rev (epochs given before
// the counter existed were create revisions of the lease bucket), written
// back with a compare-and-set. Errors: the bucket's, a counter that is
// not a base-10 integer, or ErrEpochContended.
func (e Epochs) Next(ctx context.Context, rev uint64) (uint64, error) {
	epochs, err := e.NextFor(ctx, []uint64{rev})
	if err != nil {
		return 0, err
	}
	return epochs[0], nil
}

// NextFor returns the epochs of several claims, one for each lease
// created at revs[i], with one compare-and-set of the counter for all of
// them (a cycle claiming a dead replica's partitions takes their epochs
// in one round trip, not one each): epochs[i] is above the counter and
// above epochs[i-1], at least revs[i]; the counter is written to the
// last. revs empty: nothing is read or written. Errors as Next's.
func (e Epochs) NextFor(ctx context.Context, revs []uint64) ([]uint64, error) {
	if len(revs) == 0 {
		return nil, nil
	}
	for range epochTries {
		last, at, err := e.read(ctx)
		if err != nil {
			return nil, err
		}
		epochs := make([]uint64, len(revs))
		for i, rev := range revs {
			last = max(last+1, rev)
			epochs[i] = last
		}
		if err := e.write(ctx, last, at); err == nil {
			return epochs, nil
		} else if !RevisionLost(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("owner: lease epoch: %w", ErrEpochContended)
}

// Raise lifts the counter to at least floor, so that the next claim's
// epoch is above it. A counter already there is left alone. Errors as
// Next's.
func (e Epochs) Raise(ctx context.Context, floor uint64) error {
	for range epochTries {
		last, at, err := e.read(ctx)
		if err != nil {
			return err
		}
		if last >= floor {
			return nil
		}
		if err := e.write(ctx, floor, at); err == nil {
			return nil
		} else if !RevisionLost(err) {
			return err
		}
	}
	return fmt.Errorf("owner: lease epoch: %w", ErrEpochContended)
}

// read returns the counter's value and the revision it was read at (0,
// 0 when the key does not exist).
func (e Epochs) read(ctx context.Context) (last, rev uint64, err error) {
	en, err := e.KV.Get(ctx, wire.EpochKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("owner: read the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, e.KV.Bucket(), err)
	}
	last, err = strconv.ParseUint(string(en.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("owner: the lease epoch counter (key %q of bucket %q) holds %q, not a base-10 integer: %w", wire.EpochKey, e.KV.Bucket(), en.Value(), err)
	}
	return last, en.Revision(), nil
}

// write sets the counter to v if it is still at revision rev (0: if it
// does not exist).
func (e Epochs) write(ctx context.Context, v, rev uint64) error {
	val := []byte(strconv.FormatUint(v, 10))
	var err error
	if rev == 0 {
		_, err = e.KV.Create(ctx, wire.EpochKey, val)
	} else {
		_, err = e.KV.Update(ctx, wire.EpochKey, val, rev)
	}
	if err != nil && !RevisionLost(err) {
		return fmt.Errorf("owner: write the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, e.KV.Bucket(), err)
	}
	return err
}

// RevisionLost reports whether a key-value Create or Update failed because
// the key changed since it was read (jetstream.ErrKeyRevisionMismatch,
// jetstream.ErrKeyExists): a compare-and-set lost to another writer.
func RevisionLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// RefusedEpochFloor is what the counter is raised to after a receiver
// answered stale-epoch to a webhook sent under epoch: the highest epoch
// it processed for the stream (wire.HeaderOrderEpoch, named) when it
// named one, else twice the refused epoch (a receiver that names nothing
// is passed after a few refusals, by at most twice its epoch; never
// wrapping around to a low epoch).
func RefusedEpochFloor(epoch, named uint64) uint64 {
	if named > 0 {
		return named
	}
	if epoch > math.MaxUint64/4 {
		return math.MaxUint64 / 2 // doubling would wrap around to a low epoch
	}
	return max(2*epoch, 1)
}

// AfterStale raises the counter after a receiver answered stale-epoch to
// a webhook sent under epoch (named: the epoch its answer names, 0 for
// none), before the partition is released: whoever claims it next sends
// above what the receiver processed. A failure is logged on log; the next
// refusal raises it again.
func (e Epochs) AfterStale(ctx context.Context, log *slog.Logger, epoch, named uint64) {
	if e.KV == nil {
		return
	}
	floor := RefusedEpochFloor(epoch, named)
	if err := e.Raise(ctx, floor); err != nil {
		log.Warn("raising the lease epoch counter after a stale-epoch answer failed; the next refusal raises it again",
			slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Any("error", err))
		return
	}
	log.Info("raised the lease epoch counter above the receiver's; the partition's next claim sends above it",
		slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Uint64("counter_floor", floor))
}
