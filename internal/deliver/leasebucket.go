package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// buckets are the lease and park buckets' configurations, as provision
// creates them.
type buckets struct {
	js     jetstream.JetStream
	log    *slog.Logger
	leases jetstream.KeyValueConfig
	parks  jetstream.KeyValueConfig
}

// restore creates the lease and park buckets again where they are gone:
// deleted while replicas run (by an operator, or a JetStream store lost).
// The key-value handles the replica holds name their bucket, so they work
// again once it exists; what the deleted buckets held is gone: leases are
// claimed again (their epochs come from the park bucket's epoch counter,
// not from the lease bucket's revisions, see leaseEpochs), and a park
// entry lost lets its stream's held events go on.
func (b buckets) restore(ctx context.Context) {
	for _, cfg := range []jetstream.KeyValueConfig{b.leases, b.parks} {
		if _, err := b.js.KeyValue(ctx, cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		if _, err := bucket(ctx, b.js, cfg); err != nil {
			b.log.Warn("a key-value bucket of ordered delivery is gone; creating it again failed, retrying at the next round",
				slog.String("bucket", cfg.Bucket), slog.Any("error", err))
			continue
		}
		b.log.Warn("a key-value bucket of ordered delivery was deleted while this replica ran; created it again",
			slog.String("bucket", cfg.Bucket))
	}
}

// bucketGone reports whether err says a key-value bucket's stream does
// not exist (a KV watch or listing reports nats.ErrStreamNotFound, of
// nats.go's older API).
func bucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// leaseEpochs hands out the lease epochs of partition claims
// (wire.HeaderLeaseEpoch) from a counter in the park bucket
// (wire.EpochKey), which has no TTL and outlives the lease bucket.
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
// The counter can be lost with the park bucket, or a receiver may have
// seen higher epochs from another deployment: its gate then answers
// stale-epoch, and raise lifts the counter above the epoch it names
// (wire.HeaderOrderEpoch), or doubles the refused epoch when it names
// none, before the partition is claimed again: a stream is refused for at
// most one claim per raise, never for ever.
type leaseEpochs struct {
	kv jetstream.KeyValue // the park bucket
}

// epochTries bounds the compare-and-set rounds of next and raise: each
// failed round means another claim or raise wrote the counter meanwhile.
const epochTries = 20

// errEpochContended is returned when epochTries compare-and-set rounds
// all lost to other writers.
var errEpochContended = errors.New("the lease epoch counter changed at every try")

// next returns the epoch of a claim whose lease key was created at
// revision rev: the counter plus one, at least rev (epochs given before
// the counter existed were create revisions of the lease bucket), written
// back with a compare-and-set.
func (le leaseEpochs) next(ctx context.Context, rev uint64) (uint64, error) {
	for range epochTries {
		last, at, err := le.read(ctx)
		if err != nil {
			return 0, err
		}
		epoch := max(last+1, rev)
		if err := le.write(ctx, epoch, at); err == nil {
			return epoch, nil
		} else if !casLost(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("deliver: lease epoch: %w", errEpochContended)
}

// raise lifts the counter to at least floor, so that the next claim's
// epoch is above it. A counter already there is left alone.
func (le leaseEpochs) raise(ctx context.Context, floor uint64) error {
	for range epochTries {
		last, at, err := le.read(ctx)
		if err != nil {
			return err
		}
		if last >= floor {
			return nil
		}
		if err := le.write(ctx, floor, at); err == nil {
			return nil
		} else if !casLost(err) {
			return err
		}
	}
	return fmt.Errorf("deliver: lease epoch: %w", errEpochContended)
}

// read returns the counter's value and the revision it was read at (0,
// 0 when the key does not exist).
func (le leaseEpochs) read(ctx context.Context) (last, rev uint64, err error) {
	e, err := le.kv.Get(ctx, wire.EpochKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("deliver: read the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, le.kv.Bucket(), err)
	}
	last, err = strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("deliver: the lease epoch counter (key %q of bucket %q) holds %q, not a base-10 integer: %w", wire.EpochKey, le.kv.Bucket(), e.Value(), err)
	}
	return last, e.Revision(), nil
}

// write sets the counter to v if it is still at revision rev (0: if it
// does not exist).
func (le leaseEpochs) write(ctx context.Context, v, rev uint64) error {
	val := []byte(strconv.FormatUint(v, 10))
	var err error
	if rev == 0 {
		_, err = le.kv.Create(ctx, wire.EpochKey, val)
	} else {
		_, err = le.kv.Update(ctx, wire.EpochKey, val, rev)
	}
	if err != nil && !casLost(err) {
		return fmt.Errorf("deliver: write the lease epoch counter (key %q of bucket %q): %w", wire.EpochKey, le.kv.Bucket(), err)
	}
	return err
}

// casLost reports whether a key-value Create or Update failed because the
// key changed since it was read.
func casLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// refusedEpochFloor is what the counter is raised to after a receiver
// answered stale-epoch to a webhook sent under epoch: the highest epoch
// it processed for the stream (wire.HeaderOrderEpoch) when it named one,
// else twice the refused epoch (a receiver that names nothing is passed
// after a few refusals, by at most twice its epoch).
func refusedEpochFloor(epoch, named uint64) uint64 {
	if named > 0 {
		return named
	}
	if epoch > math.MaxUint64/4 {
		return math.MaxUint64 / 2 // doubling would wrap around to a low epoch
	}
	return max(2*epoch, 1)
}

// afterStale raises the counter after a receiver answered stale-epoch to
// a webhook sent under epoch (named: the epoch its answer names, 0 for
// none), before the partition is released: whoever claims it next sends
// above what the receiver processed. A failure is logged; the next
// refusal raises it again.
func (le leaseEpochs) afterStale(ctx context.Context, log *slog.Logger, epoch, named uint64) {
	if le.kv == nil {
		return
	}
	floor := refusedEpochFloor(epoch, named)
	if err := le.raise(ctx, floor); err != nil {
		log.Warn("raising the lease epoch counter after a stale-epoch answer failed; the next refusal raises it again",
			slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Any("error", err))
		return
	}
	log.Info("raised the lease epoch counter above the receiver's; the partition's next claim sends above it",
		slog.Uint64("epoch", epoch), slog.Uint64("receiver_epoch", named), slog.Uint64("counter_floor", floor))
}
