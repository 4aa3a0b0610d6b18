package migrate_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate"
	"github.com/jsbridge/jsbridge/internal/migrate/cleanup"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// leaseTTL is the lease bucket's TTL in these tests: long enough that no
// key expires while a test runs, however loaded the machine.
const leaseTTL = time.Minute

// cleanupLayout is billingAndAudit's old layout with what a cleanup must
// leave alone beside it: the old engine's keys in the lease bucket next
// to the shared engine's, a park bucket key of a subscription the old
// layout has no consumers for, and a consumer of the events stream that
// is not the old engine's.
func cleanupLayout(t *testing.T) (*oldLayout, migrate.Config) {
	t.Helper()
	l := newOldLayout(t)
	billingAndAudit(t, l)
	ctx := context.Background()
	require.NoError(t, l.Leases(ctx, leaseTTL, "billing", "old-1"))
	leases, err := l.js.KeyValue(ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	for _, k := range []string{owner.LeaseKey(0), owner.MemberKey("new-1")} {
		_, err := leases.PutString(ctx, k, "x")
		require.NoError(t, err)
	}
	_, err = l.Park.PutString(ctx, legacy.DeliveredKey("gone", 0), "{}")
	require.NoError(t, err)
	_, err = l.js.CreateConsumer(ctx, wire.DefaultEventsStream, jetstream.ConsumerConfig{Durable: "someone-else", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	return l, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}, {Name: "audit"}}}
}

// applyAndRun applies the migration of cfg, and claims partition 0 as the
// shared engine's first replica would.
func applyAndRun(t *testing.T, l *oldLayout, cfg migrate.Config) {
	t.Helper()
	ctx := context.Background()
	plan, err := migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, l.js, plan, "", 0)
	require.NoError(t, err)
	kv, err := l.js.KeyValue(ctx, position.DefaultBucket)
	require.NoError(t, err)
	part, err := position.Claim(ctx, l.js, kv, position.Config{Partition: 0, Owner: "new-1", Epoch: 119, Created: plan.EventsCreated})
	require.NoError(t, err)
	done, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, part.Run(done))
}

// pastHeartbeats is a fake clock past the lease TTL of every key
// written so far (the old heartbeat is stale) that moves on when waited
// on: whenever the cleanup's watch waits, once before (nil: at once)
// returns, it is advanced past any watch.
func pastHeartbeats(t *testing.T, before func()) clockwork.Clock {
	clock := clockwork.NewFakeClockAt(time.Now().Add(2 * leaseTTL))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for clock.BlockUntilContext(ctx, 1) == nil {
			if before != nil {
				before()
			}
			clock.Advance(time.Hour)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return clock
}

// quick is a cleanup.Config dating heartbeats by clock (nil: the real
// one) that watches the old consumers for 100 ms (on clock).
func quick(clock clockwork.Clock) cleanup.Config {
	return cleanup.Config{Archetype: base.New(clock, nil, ""), Watch: 100 * time.Millisecond}
}

// keysOf lists a bucket's keys, sorted.
func keysOf(t *testing.T, js jetstream.JetStream, bucket string) []string {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), bucket)
	require.NoError(t, err)
	l, err := kv.ListKeys(context.Background())
	require.NoError(t, err)
	var out []string
	for k := range l.Keys() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// consumersOf lists a stream's durable consumers by name, sorted.
func consumersOf(t *testing.T, js jetstream.JetStream, stream string) []string {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	require.NoError(t, err)
	var out []string
	l := s.ListConsumers(context.Background())
	for ci := range l.Info() {
		if ci.Config.Durable != "" {
			out = append(out, ci.Name)
		}
	}
	require.NoError(t, l.Err())
	slices.Sort(out)
	return out
}

func TestCleanupAfterApplyDeletesExactlyTheOldLayout(t *testing.T) {
	t.Parallel()
	l, cfg := cleanupLayout(t)
	ctx := context.Background()
	applyAndRun(t, l, cfg)
	positionsBefore := keysOf(t, l.js, position.DefaultBucket)
	dlq, err := l.js.Stream(ctx, wire.DefaultDLQStream)
	require.NoError(t, err)
	letters := dlq.CachedInfo().State.Msgs
	require.NotZero(t, letters)

	c, err := cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.NoError(t, c.Err())
	var parts []string
	oldLeaseKeys := []string{legacy.MemberKey("billing", "old-1")}
	for p := range partitions {
		parts = append(parts, legacy.PartitionDurable("billing", p))
		oldLeaseKeys = append(oldLeaseKeys, legacy.LeaseKey("billing", p))
	}
	slices.Sort(parts)
	want := &cleanup.Leftovers{
		Events: wire.DefaultEventsStream, Positions: position.DefaultBucket, Migrated: c.Migrated,
		ParkKeys: []string{
			legacy.ParkedKey("billing", eventsKey(l.b)),
			legacy.AsideKey("billing", 1, l.copyKey(t, l.c)),
			legacy.AttemptsKey("billing", eventID(l.a, 0)),
			legacy.AttemptsKey("billing", eventID(l.a, 1)),
			legacy.DeliveredKey("billing", 0),
			wire.EpochKey,
			wire.SkippedKey("billing", eventsKey(l.b)),
		},
		ParkKept:           1,
		LeaseKeys:          oldLeaseKeys,
		Durables:           []string{"audit"},
		Copy:               legacy.CopyStream(wire.DefaultEventsStream),
		PartitionConsumers: parts,
	}
	slices.Sort(want.ParkKeys)
	slices.Sort(want.LeaseKeys)
	require.NotEmpty(t, c.Migrated)
	require.Equal(t, want, c)

	require.NoError(t, cleanup.Delete(ctx, l.js, c))
	require.Equal(t, []string{"someone-else"}, consumersOf(t, l.js, wire.DefaultEventsStream))
	_, err = l.js.Stream(ctx, legacy.CopyStream(wire.DefaultEventsStream))
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.Equal(t, []string{legacy.DeliveredKey("gone", 0)}, keysOf(t, l.js, legacy.ParkBucket))
	require.Equal(t, []string{owner.LeaseKey(0), owner.MemberKey("new-1")}, keysOf(t, l.js, wire.DefaultLeaseBucket))
	require.Equal(t, positionsBefore, keysOf(t, l.js, position.DefaultBucket), "the positions bucket is the shared engine's")
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, letters, info.State.Msgs, "the dead letters stay")

	again, err := cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.NoError(t, again.Err())
	require.True(t, again.Empty(), "a second run finds nothing to do: %+v", again)
	require.Equal(t, 1, again.ParkKept)

	// A migration run after it finds nothing to move, and the migration
	// done.
	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions})
	require.NoError(t, err)
	res, err := migrate.Apply(ctx, l.js, plan, "", 0)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{Done: true}, res)
}

func TestCleanupDeletesTheParkBucketLeftEmpty(t *testing.T) {
	t.Parallel()
	l, cfg := cleanupLayout(t)
	ctx := context.Background()
	require.NoError(t, l.Park.Purge(ctx, legacy.DeliveredKey("gone", 0)))
	applyAndRun(t, l, cfg)
	c, err := cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.Equal(t, legacy.ParkBucket, c.ParkBucket)
	require.NoError(t, cleanup.Delete(ctx, l.js, c))
	_, err = l.js.KeyValue(ctx, legacy.ParkBucket)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound)
}

func TestCleanupRefusedBeforeTheMigrationAndBeforeTheSharedEngineRan(t *testing.T) {
	t.Parallel()
	l, cfg := cleanupLayout(t)
	ctx := context.Background()
	c, err := cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrNotMigrated)
	require.ErrorContains(t, c.Err(), "run `consumer migrate`")
	require.False(t, c.Empty(), "what would be deleted is listed all the same")
	require.ErrorIs(t, cleanup.Delete(ctx, l.js, c), cleanup.ErrNotMigrated)
	require.Len(t, consumersOf(t, l.js, legacy.CopyStream(wire.DefaultEventsStream)), partitions, "nothing was deleted")
	require.Contains(t, consumersOf(t, l.js, wire.DefaultEventsStream), "audit")

	plan, err := migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	_, err = migrate.Apply(ctx, l.js, plan, "", 0)
	require.NoError(t, err)
	c, err = cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrNotStarted)
	require.NotErrorIs(t, c.Err(), cleanup.ErrNotMigrated)
}

func TestCleanupRefusedWhileAnOldReplicaRuns(t *testing.T) {
	t.Parallel()
	l, cfg := cleanupLayout(t)
	ctx := context.Background()
	applyAndRun(t, l, cfg)

	// An old replica's heartbeat, written within the lease TTL.
	c, err := cleanup.Read(ctx, l.js, quick(nil))
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrOldEngineRuns)
	require.ErrorContains(t, c.Err(), legacy.MemberKey("billing", "old-1"))

	// An old replica pulling from a partition consumer.
	cons, err := l.js.Consumer(ctx, legacy.CopyStream(wire.DefaultEventsStream), legacy.PartitionDurable("billing", 3))
	require.NoError(t, err)
	cc, err := cons.Consume(func(jetstream.Msg) {}, jetstream.PullExpiry(time.Minute))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	}, 10*time.Second, 10*time.Millisecond)
	c, err = cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrOldEngineRuns)
	require.ErrorContains(t, c.Err(), legacy.PartitionDurable("billing", 3)+" on "+legacy.CopyStream(wire.DefaultEventsStream))
	require.ErrorIs(t, cleanup.Delete(ctx, l.js, c), cleanup.ErrOldEngineRuns)

	// Stopped, it pulls no more: the server drops its requests.
	cc.Stop()
	require.Eventually(t, func() bool {
		c, err = cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
		return err == nil && c.Err() == nil
	}, 10*time.Second, 20*time.Millisecond)

	// An old replica busy delivering: every pull answered (none waiting),
	// its durable's delivered and acked sequences moving.
	for i := range 50 {
		l.publish(t, l.a, 4+i)
	}
	audit, err := l.js.Consumer(ctx, wire.DefaultEventsStream, "audit")
	require.NoError(t, err)
	busy, stop := context.WithCancel(ctx)
	var acked atomic.Int64
	delivering := make(chan struct{})
	go func() {
		defer close(delivering)
		for busy.Err() == nil {
			batch, err := audit.FetchNoWait(1)
			if err != nil {
				return
			}
			for m := range batch.Messages() {
				if m.DoubleAck(busy) == nil {
					acked.Add(1)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	// The watch ends once the replica acked twice more while it waited.
	moved := func() {
		for n := acked.Load(); acked.Load() < n+2 && busy.Err() == nil; {
			time.Sleep(time.Millisecond)
		}
	}
	c, err = cleanup.Read(ctx, l.js, cleanup.Config{Archetype: base.New(pastHeartbeats(t, moved), nil, ""), Watch: time.Second})
	stop()
	<-delivering
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrOldEngineRuns)
	require.ErrorContains(t, c.Err(), "audit on "+wire.DefaultEventsStream+" (delivered ")
	require.Eventually(t, func() bool {
		c, err = cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
		return err == nil && c.Err() == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, cleanup.Delete(ctx, l.js, c))
}

// A replica of the old engine owns a partition: its partition consumer is
// pinned to the replica's client (the old engine pulls with a pinned
// priority group).
func TestCleanupRefusedWhileAPartitionIsPinned(t *testing.T) {
	t.Parallel()
	l, cfg := cleanupLayout(t)
	ctx := context.Background()
	applyAndRun(t, l, cfg)
	cons, err := l.js.CreateConsumer(ctx, legacy.CopyStream(wire.DefaultEventsStream), jetstream.ConsumerConfig{
		Durable: legacy.PartitionDurable("billing-next", 0), FilterSubject: legacy.PartitionFilter(wire.DefaultEventsPrefix, 0), AckPolicy: jetstream.AckExplicitPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"owner"}, PinnedTTL: time.Minute,
	})
	require.NoError(t, err)
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() }, jetstream.PullPriorityGroup("owner"))
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && len(info.PriorityGroups) == 1 && info.PriorityGroups[0].PinnedClientID != ""
	}, 10*time.Second, 10*time.Millisecond)

	c, err := cleanup.Read(ctx, l.js, quick(pastHeartbeats(t, nil)))
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), cleanup.ErrOldEngineRuns)
	require.ErrorContains(t, c.Err(), legacy.PartitionDurable("billing-next", 0)+" on "+legacy.CopyStream(wire.DefaultEventsStream)+" (pinned to client ")
}

// A deployment that never ran the old engine has nothing to clean up,
// migrated or not.
func TestCleanupOfNoOldLayoutFindsNothingToDo(t *testing.T) {
	t.Parallel()
	js := startServer(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
	require.NoError(t, err)
	c, err := cleanup.Read(ctx, js, quick(nil))
	require.NoError(t, err)
	require.True(t, c.Empty())
	require.NoError(t, c.Err())
	require.NoError(t, cleanup.Delete(ctx, js, c))
}
