package cleanup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
	"github.com/jsbridge/jsbridge/wire"
)

// What Read reads: the positions bucket's state, and the old
// layout kind by kind.

// migrated checks the positions bucket: mark.DoneKey written, and a record
// claimed by another owner than the migration's.
func (cl *cleaning) migrated(ctx context.Context) error {
	kv, err := cl.js.KeyValue(ctx, cl.cfg.Positions)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cl.c.refuse(ErrNotMigrated, "the positions bucket %q does not exist: run `consumer migrate` (with every old replica stopped), start the new version, then clean up", cl.cfg.Positions)
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: positions bucket %q: %w", cl.cfg.Positions, err)
	}
	if cl.c.Migrated, err = mark.Read(ctx, kv, mark.DoneKey); err != nil {
		return err
	}
	if cl.c.Migrated == "" {
		cl.c.refuse(ErrNotMigrated, "the positions bucket %q holds no %q key: run `consumer migrate` (with every old replica stopped), start the new version, then clean up", cl.cfg.Positions, mark.DoneKey)
		return nil
	}
	stored, err := position.ReadAll(ctx, kv)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if !slices.ContainsFunc(stored, func(s position.Stored) bool { return s.Revision > 0 && s.Record.Owner != mark.Owner }) {
		cl.c.refuse(ErrNotStarted, "every partition record of %q is still the migration's: start the new version (consumer run) and clean up once it runs; until then the old layout is what going back to the old version needs", cl.cfg.Positions)
	}
	return nil
}

// parkKeys lists the park bucket's keys of the old subscriptions and its
// epoch counter, and whether the bucket is left empty after them.
func (cl *cleaning) parkKeys(ctx context.Context) error {
	kv, err := cl.js.KeyValue(ctx, legacy.ParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: park bucket %q: %w", legacy.ParkBucket, err)
	}
	all, err := jsapi.Keys(ctx, kv)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, k := range all {
		if k == wire.EpochKey || slices.ContainsFunc(cl.subs, func(sub string) bool { return legacy.OldParkKey(k, sub) }) {
			cl.c.ParkKeys = append(cl.c.ParkKeys, k)
		}
	}
	if cl.c.ParkKept = len(all) - len(cl.c.ParkKeys); cl.c.ParkKept == 0 {
		cl.c.ParkBucket = legacy.ParkBucket
	}
	return nil
}

// leaseKeys lists the old engine's keys in the lease bucket, and returns
// the heartbeats among them written within the bucket's TTL.
func (cl *cleaning) leaseKeys(ctx context.Context) ([]string, error) {
	kv, err := cl.js.KeyValue(ctx, wire.DefaultLeaseBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: lease bucket %q: %w", wire.DefaultLeaseBucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: lease bucket %q: %w", wire.DefaultLeaseBucket, err)
	}
	all, err := jsapi.Keys(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var beats []string
	now := cl.cfg.Clock.Now()
	for _, k := range all {
		old, heartbeat := legacy.OldLeaseKey(k) // not the shared engine's (two tokens)
		if old {
			cl.c.LeaseKeys = append(cl.c.LeaseKeys, k)
		}
		if !heartbeat {
			continue
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: read %q of the lease bucket: %w", k, err)
		}
		if ttl := st.TTL(); ttl == 0 || now.Sub(e.Created()) < ttl {
			beats = append(beats, fmt.Sprintf("%s (written %s ago)", k, now.Sub(e.Created()).Round(time.Millisecond)))
		}
	}
	return beats, nil
}

// durables lists the unordered durables the old engine made on the
// events stream (every one: an ordered subscription's former unordered
// durable too).
func (cl *cleaning) durables(ctx context.Context) error {
	s, err := cl.js.Stream(ctx, cl.cfg.Events)
	if err != nil {
		return fmt.Errorf("migrate: events stream %q: %w", cl.cfg.Events, err)
	}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if ci.Config.Durable != "" && strings.HasPrefix(ci.Config.Description, legacy.DurableDescription) {
			cl.c.Durables = append(cl.c.Durables, ci.Name)
			cl.consumers = append(cl.consumers, ci)
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("migrate: list the consumers of %q: %w", cl.cfg.Events, err)
	}
	slices.Sort(cl.c.Durables)
	return nil
}

// copyStream lists the partitioned copy's partition consumers, and its other
// consumers (which keep it).
func (cl *cleaning) copyStream(ctx context.Context) error {
	name := legacy.CopyStream(cl.cfg.Events)
	s, err := cl.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: partitioned copy %q: %w", name, err)
	}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if _, _, ok := legacy.ParsePartitionDurable(ci.Name); ok {
			cl.c.PartitionConsumers = append(cl.c.PartitionConsumers, ci.Name)
			cl.consumers = append(cl.consumers, ci)
		} else {
			cl.c.CopyKept = append(cl.c.CopyKept, ci.Name)
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("migrate: list the consumers of %q: %w", name, err)
	}
	slices.Sort(cl.c.PartitionConsumers)
	slices.Sort(cl.c.CopyKept)
	if len(cl.c.CopyKept) == 0 {
		cl.c.Copy = name
	}
	return nil
}
