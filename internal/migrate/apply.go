package migrate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
	"github.com/jsbridge/jsbridge/wire"
)

var (
	// ErrLocked is returned by Apply when another migration, of another
	// plan, holds mark.LockKey.
	ErrLocked = errors.New("migrate: another migration holds the lock")
	// ErrMigratedOtherwise is returned by Apply when the positions bucket
	// was already written: by a migration of another plan (the old layout
	// changed since), or by the new engine itself.
	ErrMigratedOtherwise = errors.New("migrate: the positions bucket was already written")
)

// Result says what Apply did.
type Result struct {
	// Done is true when the plan was applied before: nothing was written.
	Done bool
	// Records and Cursors count the partition records and cursor keys
	// written.
	Records, Cursors int
	// AllowDirect is true when the events stream's AllowDirect was
	// turned on.
	AllowDirect bool
}

// Apply writes plan to the positions bucket named bucket
// (position.DefaultBucket when empty; created with
// replicas replicas when missing, 0: the events stream's), idempotently:
// under mark.LockKey, then AllowDirect turned on for the events stream, then
// mark.PartitionsKey, each partition record (claimed as mark.Owner at epoch 0,
// edited, committed once, with its partition's cursor keys), the lease
// epoch counter (never lowered), the skipped-version records, and
// mark.DoneKey last. A second run of the same plan returns Result.Done, and
// so does a run of a plan with no subscription once one was applied
// (the old layout deleted since: cleanup.Delete). It
// deletes nothing of the old layout (that is a later step, after the new
// engine ran). Errors: ErrRefused (wrapped, the plan's refusals),
// ErrLocked, ErrMigratedOtherwise, and the server's.
func Apply(ctx context.Context, js jetstream.JetStream, plan *Plan, bucket string, replicas int) (Result, error) {
	var res Result
	if err := plan.Err(); err != nil {
		return res, err
	}
	events, err := js.Stream(ctx, plan.Events)
	if err != nil {
		return res, fmt.Errorf("migrate: events stream %q: %w", plan.Events, err)
	}
	if replicas == 0 {
		replicas = events.CachedInfo().Config.Replicas
	}
	kv, err := position.Bucket(ctx, js, bucket, replicas)
	if err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	switch done, err := mark.Read(ctx, kv, mark.DoneKey); {
	case err != nil:
		return res, err
	case done == plan.Fingerprint, done != "" && len(plan.Subscriptions) == 0:
		// The same plan, or nothing left to move (the old layout was
		// deleted since: --cleanup).
		res.Done = true
		return res, nil
	case done != "":
		return res, fmt.Errorf("%w: by the migration of another layout (fingerprint %s, this plan's %s): the old layout changed since, or was migrated from another configuration", ErrMigratedOtherwise, done, plan.Fingerprint)
	}
	if err := lock(ctx, kv, plan.Fingerprint); err != nil {
		return res, err
	}
	if err := checkUnclaimed(ctx, kv); err != nil {
		return res, err
	}
	if !events.CachedInfo().Config.AllowDirect {
		cfg := events.CachedInfo().Config
		cfg.AllowDirect = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return res, fmt.Errorf("migrate: turn AllowDirect on for the events stream %q: %w", plan.Events, err)
		}
		res.AllowDirect = true
	}
	if err := createOrSame(ctx, kv, mark.PartitionsKey, strconv.Itoa(plan.Partitions)); err != nil {
		return res, err
	}
	for p, rec := range plan.Records {
		n, err := writePartition(ctx, js, kv, plan, p, rec)
		if err != nil {
			return res, err
		}
		res.Records++
		res.Cursors += n
	}
	if err := raiseEpoch(ctx, kv, plan.Epoch); err != nil {
		return res, err
	}
	for _, k := range slices.Sorted(maps.Keys(plan.Skipped)) {
		if _, err := kv.PutString(ctx, k, plan.Skipped[k]); err != nil {
			return res, fmt.Errorf("migrate: copy %q to bucket %q: %w", k, kv.Bucket(), err)
		}
	}
	if _, err := kv.PutString(ctx, mark.DoneKey, plan.Fingerprint); err != nil {
		return res, fmt.Errorf("migrate: write %q of bucket %q: %w", mark.DoneKey, kv.Bucket(), err)
	}
	if err := kv.Delete(ctx, mark.LockKey); err != nil {
		return res, fmt.Errorf("migrate: the migration is done, but its lock %q of bucket %q stays (delete it): %w", mark.LockKey, kv.Bucket(), err)
	}
	return res, nil
}

// lock takes mark.LockKey for fingerprint, or goes on under a lock of the same
// plan (a run that stopped midway).
func lock(ctx context.Context, kv jetstream.KeyValue, fingerprint string) error {
	_, err := kv.Create(ctx, mark.LockKey, []byte(fingerprint))
	if !errors.Is(err, jetstream.ErrKeyExists) {
		if err != nil {
			return fmt.Errorf("migrate: take the lock %q of bucket %q: %w", mark.LockKey, kv.Bucket(), err)
		}
		return nil
	}
	held, err := mark.Read(ctx, kv, mark.LockKey)
	if err != nil {
		return err
	}
	if held != fingerprint {
		return fmt.Errorf("%w: %q of bucket %q names the plan %s, this one is %s (when no migration runs, delete the key: nats kv del %s %s)",
			ErrLocked, mark.LockKey, kv.Bucket(), held, fingerprint, kv.Bucket(), mark.LockKey)
	}
	return nil
}

// createOrSame creates key with val, or finds it holding val already.
func createOrSame(ctx context.Context, kv jetstream.KeyValue, key, val string) error {
	_, err := kv.Create(ctx, key, []byte(val))
	if !errors.Is(err, jetstream.ErrKeyExists) {
		if err != nil {
			return fmt.Errorf("migrate: write %q of bucket %q: %w", key, kv.Bucket(), err)
		}
		return nil
	}
	have, err := mark.Read(ctx, kv, key)
	if err != nil {
		return err
	}
	if have != val {
		return fmt.Errorf("%w: %q of bucket %q holds %q, the plan %q", ErrMigratedOtherwise, key, kv.Bucket(), have, val)
	}
	return nil
}

// checkUnclaimed refuses a bucket whose records another owner than the
// migration wrote: the new engine ran, and its positions are newer than
// the old layout's.
func checkUnclaimed(ctx context.Context, kv jetstream.KeyValue) error {
	stored, err := position.ReadAll(ctx, kv)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, s := range stored {
		if s.Revision > 0 && s.Record.Owner != mark.Owner {
			return fmt.Errorf("%w: %s is %q's (epoch %d): the new engine ran on it", ErrMigratedOtherwise, position.Key(s.Partition), s.Record.Owner, s.Record.Epoch)
		}
	}
	return nil
}

// writePartition claims partition p's record as mark.Owner, sets it to rec and
// its cursors to the plan's, and commits once; it returns the cursor keys
// written.
func writePartition(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, plan *Plan, p int, rec position.Record) (int, error) {
	part, err := position.Claim(ctx, js, kv, position.Config{Partition: p, Owner: mark.Owner, Created: plan.EventsCreated})
	if err != nil {
		return 0, fmt.Errorf("migrate: claim %s: %w", position.Key(p), err)
	}
	part.Edit(func(r *position.Record) {
		r.Floor = rec.Floor
		r.Streams, r.Members = maps.Clone(rec.Streams), maps.Clone(rec.Members)
		r.Ahead = make(map[string]map[string]position.Entry, len(rec.Ahead))
		for sub, own := range rec.Ahead {
			r.Ahead[sub] = maps.Clone(own)
		}
		r.Asides, r.Retries, r.Detached = slices.Clone(rec.Asides), slices.Clone(rec.Retries), slices.Clone(rec.Detached)
	})
	n := 0
	for _, c := range plan.Cursors {
		if c.Partition != p {
			continue
		}
		part.Detach(c.Subscription, c.Cursor.State) // false when a run that stopped midway wrote it
		part.EditCursor(c.Subscription, func(cur *position.Cursor) {
			*cur = position.Cursor{State: c.Cursor.State, Floor: c.Cursor.Floor, Streams: maps.Clone(c.Cursor.Streams), Above: slices.Clone(c.Cursor.Above)}
		})
		n++
	}
	done, cancel := context.WithCancel(ctx)
	cancel() // Run commits what is left once, and returns
	if err := part.Run(done); err != nil {
		return 0, fmt.Errorf("migrate: write %s: %w", position.Key(p), err)
	}
	return n, nil
}

// raiseEpoch copies the lease epoch counter: to epoch, unless the bucket
// holds a higher one (epochs only grow).
func raiseEpoch(ctx context.Context, kv jetstream.KeyValue, epoch uint64) error {
	if epoch == 0 {
		return nil
	}
	for range 20 {
		e, err := kv.Get(ctx, wire.EpochKey)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("migrate: read %q of bucket %q: %w", wire.EpochKey, kv.Bucket(), err)
		default:
			have, err := strconv.ParseUint(string(e.Value()), 10, 64)
			if err != nil {
				return fmt.Errorf("migrate: %q of bucket %q holds %q, not a base-10 integer", wire.EpochKey, kv.Bucket(), e.Value())
			}
			if have >= epoch {
				return nil
			}
			rev = e.Revision()
		}
		val := []byte(strconv.FormatUint(epoch, 10))
		if rev == 0 {
			_, err = kv.Create(ctx, wire.EpochKey, val)
		} else {
			_, err = kv.Update(ctx, wire.EpochKey, val, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("migrate: write %q of bucket %q: %w", wire.EpochKey, kv.Bucket(), err)
		}
	}
	return fmt.Errorf("migrate: %q of bucket %q changed at every try", wire.EpochKey, kv.Bucket())
}
