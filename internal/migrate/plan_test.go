package migrate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/internal/migrate/migratetest"
	"github.com/jsbridge/jsbridge/wire"
)

// billingAndAudit builds, on the old layout, an ordered subscription
// "billing" stopped mid-flow and an unordered one "audit":
//
//   - billing partition 0 (streams a and b): a0 b0 settled (ack floor copy
//     2), b1 dead-lettered and its stream parked (acked above the floor,
//     in the delivered record, its skipped version recorded), a1 a2 b2 a3
//     pending (in hand, held), a1 failed three times (its attempts count);
//   - billing partition 1 (stream c): c0 refused in place (pending), c1
//     acked out behind an aside record (head copy 3, from copy 8): the
//     ack floor stays at 0;
//   - billing partitions 2 and 3: nothing delivered;
//   - audit: events 6–11 delivered, 6, 7 and 9 acked (ack floor 7).
func billingAndAudit(t *testing.T, l *oldLayout) {
	t.Helper()
	ctx := context.Background()
	sent, err := l.DeliverOrdered(ctx, "billing", migratetest.Durable{AckWait: time.Hour}, outcomes(migratetest.Accepted, map[string]migratetest.Outcome{
		eventID(l.a, 1): migratetest.Failing, eventID(l.b, 1): migratetest.Refused, eventID(l.c, 0): migratetest.SetAside,
	}))
	require.NoError(t, err)
	require.Len(t, sent, 2, "a0 b0")

	// a1, the head of a in its lane, failed three times; an event that
	// settled since left a count behind.
	require.NoError(t, l.PutAttempts(ctx, "billing", eventID(l.a, 1), 3))
	require.NoError(t, l.PutAttempts(ctx, "billing", eventID(l.a, 0), 1))

	sent, err = l.Deliver(ctx, "audit", migratetest.Durable{Endpoint: "http://127.0.0.1:1/audit", AckWait: time.Hour}, 11, bySeq(migratetest.InFlight, 6, 7, 9))
	require.NoError(t, err)
	require.Len(t, sent, 3)
}

func TestPlanTranslatesTheOldLayout(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	billingAndAudit(t, l)
	ctx := context.Background()
	require.Equal(t, uint64(6), l.seq[l.a][0], "the events stream's sequences are the copy's + 5")

	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{
		{Name: "billing", Ordered: true}, {Name: "audit"},
	}})
	require.NoError(t, err)
	require.NoError(t, plan.Err())

	require.Equal(t, uint64(118), plan.Epoch, "the lease epoch counter is copied")
	require.Equal(t, []string{wire.SkippedKey("billing", eventsKey(l.b))}, keys(plan.Skipped))
	require.Equal(t, uint64(14), plan.Sourced)
	require.False(t, plan.AllowDirect)

	// The ordered subscription: floors translated from copy sequences
	// (partition 0's ack floor stops before its next pending event, a1 at
	// copy 4: copy 3, c0, is events 8; copy 0, before the copy's first
	// message, is the event before its origin, 5), b's entry (copy 5 → events 10)
	// with the version the chain names after b1 (dead-lettered: its
	// predecessor 0), b parked from its head (events 10, from its dead
	// letter), c set aside from its refused head c0 (events 8), which
	// never settled.
	b, c := eventsKey(l.b), eventsKey(l.c)
	member := func(f uint64) map[string]uint64 { return map[string]uint64{"billing": f} }
	want := []position.Record{
		{Floor: 8, Members: member(8), Ahead: map[string]map[string]position.Entry{"billing": {b: {Seq: 10, Version: 0}}},
			Asides:  []position.Aside{{Sub: "billing", Stream: b, From: 10, State: migrate.StateParked}},
			Retries: []position.Retry{{Sub: "billing", Seq: 9, Attempts: 3}}},
		{Floor: 5, Members: member(5), Asides: []position.Aside{{Sub: "billing", Stream: c, From: 8, State: migrate.StateStuck}}},
		{Floor: 5, Members: member(5)},
		{Floor: 5, Members: member(5)},
	}
	require.Equal(t, want, plan.Records)

	billing := plan.Subscriptions[0]
	require.Equal(t, "billing", billing.Name)
	require.Equal(t, uint64(5), billing.Floor)
	require.Equal(t, 5, billing.Pending, "a1 a2 b2 a3 in partition 0, c0 in partition 1")
	require.Zero(t, billing.Resent, "every acked event is at or below the floor, its stream's entry, or an aside")
	require.Equal(t, 1, billing.Attempts, "a0's count names no event pending: not carried")
	require.Equal(t, []migrate.PartitionPlan{
		{Partition: 0, CopyFloor: 3, Floor: 8, Pending: 4, Settled: 1},
		{Partition: 1, CopyFloor: 0, Floor: 5, Pending: 1},
		{Partition: 2, Floor: 5},
		{Partition: 3, Floor: 5},
	}, billing.Partitions)
	require.Equal(t, []migrate.StreamPlan{
		{Partition: 0, Stream: b, From: 10, State: migrate.StateParked, Head: eventID(l.b, 1)},
		{Partition: 1, Stream: c, From: 8, State: migrate.StateStuck},
	}, billing.Asides)

	// The unordered subscription: a cursor from its ack floor on every
	// partition; of (7, 11], 9 was acked and is sent again, 8, 10 and
	// 11 are pending.
	audit := plan.Subscriptions[1]
	require.Equal(t, migrate.SubscriptionPlan{Name: "audit", Floor: 7, Delivered: 11, Pending: 3, Resent: 1}, audit)
	var cursors []migrate.CursorPlan
	for p := range partitions {
		cursors = append(cursors, migrate.CursorPlan{Subscription: "audit", Partition: p, Cursor: position.Cursor{State: migrate.StateBehind, Floor: 7}})
	}
	require.Equal(t, cursors, plan.Cursors)

	var out bytes.Buffer
	require.NoError(t, plan.Print(&out))
	require.Contains(t, out.String(), "subscription audit (unordered): floor 7, last delivered 11, pending 3, re-sent 1")
	require.Contains(t, out.String(), "parked: partition 0, stream "+b+", from 10, head event "+eventID(l.b, 1))

	again, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{
		{Name: "billing", Ordered: true}, {Name: "audit"},
	}})
	require.NoError(t, err)
	require.Equal(t, plan.Fingerprint, again.Fingerprint, "the same old layout plans the same")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestPlanRefusesALayoutThatDisagrees(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	ctx := context.Background()
	_, err := l.PartitionConsumers(ctx, "billing", migratetest.Durable{})
	require.NoError(t, err)
	cfg := migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}}}

	plan, err := migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	require.NoError(t, plan.Err())

	other := cfg
	other.Partitions = 16
	plan, err = migrate.ReadPlan(ctx, l.js, other)
	require.NoError(t, err)
	require.ErrorIs(t, plan.Err(), migrate.ErrRefused)
	require.ErrorContains(t, plan.Err(), "partitioned for another count than --partitions 16")
	require.Empty(t, plan.Records, "nothing is planned from a copy whose partitions are not the engine's")

	require.NoError(t, l.js.DeleteConsumer(ctx, legacy.CopyStream(wire.DefaultEventsStream), legacy.PartitionDurable("billing", 2)))
	plan, err = migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	require.Equal(t, []migrate.Refusal{{Subscription: "billing", Partition: 2, Reason: plan.Refusals[0].Reason}}, plan.Refusals)
	require.Contains(t, plan.Refusals[0].Reason, `partition consumer "billing_p2" is missing`)

	require.NoError(t, l.js.DeleteStream(ctx, wire.DefaultEventsStream))
	_, err = l.js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
	require.NoError(t, err)
	plan, err = migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	require.ErrorContains(t, plan.Err(), "past its last sequence 0: the events stream was made again")

	require.NoError(t, l.js.DeleteStream(ctx, legacy.CopyStream(wire.DefaultEventsStream)))
	plan, err = migrate.ReadPlan(ctx, l.js, cfg)
	require.NoError(t, err)
	require.ErrorContains(t, plan.Err(), `the partitioned copy "EVENTS_ORDERED" does not exist`)

	_, err = migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: 0})
	require.ErrorIs(t, err, migrate.ErrInvalidConfig)
	require.ErrorContains(t, err, "Partitions 0")
}

func TestDiscoverFindsTheOldEnginesSubscriptions(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	billingAndAudit(t, l)
	ctx := context.Background()
	_, err := l.js.CreateConsumer(ctx, wire.DefaultEventsStream, jetstream.ConsumerConfig{Durable: "someone-elses"})
	require.NoError(t, err)
	subs, err := legacy.Discover(ctx, l.js, "")
	require.NoError(t, err)
	require.Equal(t, []legacy.Subscription{{Name: "audit"}, {Name: "billing", Ordered: true}}, subs)
}

// With ReadPending, an unordered durable's pending events are read back
// from the stopped durable: of (ack floor, last delivered] only those are
// left to send, and the acked ones go into the Above of their partition's
// cursor. A pending
// event that does not come back within AckWait plus its longest BackOff
// step (a Nak delayed longer) leaves the plan inexact: the acked ones are
// counted as re-sent.
func TestPlanReadsAnUnorderedPendingSetBack(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for AckWait (1 s) and the read's bound (3 s)")
	}
	t.Parallel()
	l := newOldLayout(t)
	ctx := context.Background()
	durable := migratetest.Durable{AckWait: time.Second}
	_, err := l.Deliver(ctx, "quick", durable, 11, bySeq(migratetest.InFlight, 6, 7, 9)) // 8, 10, 11 pending
	require.NoError(t, err)
	durable.NakDelay = time.Hour
	_, err = l.Deliver(ctx, "delayed", durable, 11, func(ev migratetest.Event) migratetest.Outcome {
		if ev.Seq == 11 {
			return migratetest.Failing
		}
		return bySeq(migratetest.InFlight, 6, 7, 9)(ev)
	})
	require.NoError(t, err)

	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, ReadPending: true,
		Subscriptions: []legacy.Subscription{{Name: "quick"}, {Name: "delayed"}}})
	require.NoError(t, err)
	quick, delayed := plan.Subscriptions[0], plan.Subscriptions[1]
	require.Equal(t, uint64(0), quick.Resent)
	require.Equal(t, 3, quick.Pending)
	require.Equal(t, uint64(1), delayed.Resent, "9 was acked, and 11 did not come back to prove it")
	for _, c := range plan.Cursors {
		switch c.Subscription {
		case "quick": // 9 is a1, of partition 0
			want := position.Cursor{State: migrate.StateBehind, Floor: 7}
			if c.Partition == 0 {
				want.Above = []uint64{9}
			}
			require.Equal(t, want, c.Cursor, "partition %d", c.Partition)
		case "delayed":
			require.Equal(t, position.Cursor{State: migrate.StateBehind, Floor: 7}, c.Cursor)
		}
	}
}

// A delivered record of a copy made before this one is not read (the old
// engine does not read it either): what was acked above the floor of its
// partition is counted as re-sent.
func TestPlanCountsWhatAStaleDeliveredRecordLeavesToResend(t *testing.T) {
	t.Parallel()
	l := newOldLayout(t)
	ctx := context.Background()
	_, err := l.DeliverOrdered(ctx, "billing", migratetest.Durable{AckWait: time.Hour}, outcomes(migratetest.Accepted, map[string]migratetest.Outcome{
		eventID(l.a, 1): migratetest.InFlight, eventID(l.b, 2): migratetest.InFlight, // b1 acked above the floor
	}))
	require.NoError(t, err)
	stale, err := json.Marshal(legacy.DeliveredRecord{Copy: 1, Streams: map[string]uint64{l.copyKey(t, l.b): l.copySeq(l.b, 1)}})
	require.NoError(t, err)
	_, err = l.Park.Put(ctx, legacy.DeliveredKey("billing", 0), stale)
	require.NoError(t, err)

	plan, err := migrate.ReadPlan(ctx, l.js, migrate.Config{Partitions: partitions, Subscriptions: []legacy.Subscription{{Name: "billing", Ordered: true}}})
	require.NoError(t, err)
	require.NoError(t, plan.Err())
	billing := plan.Subscriptions[0]
	require.Equal(t, uint64(1), billing.Resent, "b1")
	require.Equal(t, 4, billing.Pending)
	require.Nil(t, plan.Records[0].Ahead, "nothing is taken from the stale record")
	require.Len(t, billing.Notes, 1)
	require.Contains(t, billing.Notes[0], "of a copy made before this one")
}
