package migrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
	"github.com/jsbridge/jsbridge/internal/migrate/migratetest"
	"github.com/jsbridge/jsbridge/wire"
)

func TestApplyWritesThePlanOnceAndASecondRunFindsItDone(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	billingAndAudit(t, l)
	ctx := context.Background()
	cfg := migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}, {Name: "audit"}}}
	plan, err := migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)

	res, err := migrate.Apply(ctx, l.js, plan, "", 0)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{Records: partitions, Cursors: partitions, AllowDirect: true}, res)

	kv, err := l.js.KeyValue(ctx, position.DefaultBucket)
	require.NoError(t, err)
	stored, err := position.ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Len(t, stored, partitions)
	for p, s := range stored {
		want := plan.Records[p]
		got := s.Record
		require.Equal(t, mark.Owner, got.Owner)
		require.Equal(t, plan.EventsCreated.UnixNano(), got.Created, "the record names the events stream it holds sequences of")
		require.Equal(t, want.Floor, got.Floor, "partition %d", p)
		require.Equal(t, want.Members, got.Members, "partition %d", p)
		require.Equal(t, want.Ahead, got.Ahead, "partition %d", p)
		require.Equal(t, want.Asides, got.Asides, "partition %d", p)
		require.Equal(t, want.Retries, got.Retries, "partition %d", p)
		require.Equal(t, map[string]position.Cursor{"audit": {State: migrate.StateBehind, Floor: 7}}, s.Cursors, "partition %d", p)
	}
	for key, want := range map[string]string{
		wire.EpochKey:      "118",
		mark.PartitionsKey: "4",
		mark.DoneKey:       plan.Fingerprint,
		wire.SkippedKey("billing", eventsKey(l.b)): plan.Skipped[wire.SkippedKey("billing", eventsKey(l.b))],
	} {
		e, err := kv.Get(ctx, key)
		require.NoError(t, err, key)
		require.Equal(t, want, string(e.Value()), key)
	}
	_, err = kv.Get(ctx, mark.LockKey)
	require.Error(t, err, "the lock is released")
	info, err := l.Events.Info(ctx)
	require.NoError(t, err)
	require.True(t, info.Config.AllowDirect)

	// The old layout has not changed: a second run plans the same and
	// writes nothing.
	bucket, err := l.js.Stream(ctx, "KV_"+position.DefaultBucket)
	require.NoError(t, err)
	before, err := bucket.Info(ctx)
	require.NoError(t, err)
	again, err := migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	require.Equal(t, plan.Fingerprint, again.Fingerprint)
	res, err = migrate.Apply(ctx, l.js, again, "", 0)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{Done: true}, res)
	after, err := bucket.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, before.State.LastSeq, after.State.LastSeq, "the second run wrote nothing")

	// A plan of another layout is refused once one was applied.
	other, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "audit"}}})
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, l.js, other, "", 0)
	require.ErrorIs(t, err, migrate.ErrMigratedOtherwise)
}

func TestApplyRefusesARefusedPlan(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	ctx := context.Background()
	_, err := l.PartitionConsumers(ctx, "billing", migratetest.Durable{})
	require.NoError(t, err)
	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: 16, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}}})
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, l.js, plan, "", 0)
	require.ErrorIs(t, err, migrate.ErrRefused)
	_, err = l.js.KeyValue(ctx, position.DefaultBucket)
	require.Error(t, err, "nothing was written, not even the bucket")
}

func TestApplyGoesOnUnderItsOwnLockAndNotUnderAnothers(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	billingAndAudit(t, l)
	ctx := context.Background()
	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}, {Name: "audit"}}})
	require.NoError(t, err)
	kv, err := position.Bucket(ctx, l.js, "", 1)
	require.NoError(t, err)

	_, err = kv.PutString(ctx, mark.LockKey, "another-plan")
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, l.js, plan, "", 0)
	require.ErrorIs(t, err, migrate.ErrLocked)

	// A run of this plan that stopped midway: its lock, one record and
	// one cursor key written.
	_, err = kv.PutString(ctx, mark.LockKey, plan.Fingerprint)
	require.NoError(t, err)
	part, err := position.Claim(ctx, l.js, kv, position.Config{Partition: 2, Owner: mark.Owner, Created: plan.EventsCreated})
	require.NoError(t, err)
	part.Detach("audit", migrate.StateBehind)
	done, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, part.Run(done))

	res, err := migrate.Apply(ctx, l.js, plan, "", 0)
	require.NoError(t, err)
	require.Equal(t, partitions, res.Records)
	stored, err := position.ReadAll(ctx, kv)
	require.NoError(t, err)
	require.Equal(t, plan.Records[2].Floor, stored[2].Record.Floor)
	require.Equal(t, position.Cursor{State: migrate.StateBehind, Floor: 7}, stored[2].Cursors["audit"])
}
