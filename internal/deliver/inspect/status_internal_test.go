package inspect

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// The status tables are pure functions of what the buckets hold: the
// replicas from their heartbeats and the leases naming them, the
// partitions from the leases and records (a stale cursor, whose
// subscription the record still lists, is not counted), and each
// subscription's lowest position against the events stream's last
// sequence.
func TestStatusOf(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 10, 0, time.UTC)
	beats := map[string]time.Time{"b": now.Add(-3 * time.Second), "a": now.Add(-time.Second)}
	leases := map[int]string{0: "a", 1: "b", 2: "a", 5: "gone"}
	require.Equal(t, []ReplicaStatus{
		{ID: "a", Heartbeat: beats["a"], Age: time.Second, Partitions: []int{0, 2}},
		{ID: "b", Heartbeat: beats["b"], Age: 3 * time.Second, Partitions: []int{1}},
	}, replicasOf(beats, leases, now))

	written := now.Add(-time.Minute)
	parts := []position.Stored{
		{Partition: 0, Updated: written, Record: position.Record{Owner: "a", Epoch: 3, Floor: 100,
			Members: map[string]uint64{"orders": 0, "audit": 120},
			Asides:  []position.Aside{{Sub: "orders", Stream: "events.order.order-1", From: 90, State: "parked"}}},
			Cursors: map[string]position.Cursor{"reports": {State: "paused", Floor: 40}, "audit": {State: "behind", Floor: 1}}},
		{Partition: 1, Updated: written, Record: position.Record{Owner: "a", Epoch: 2, Floor: 130, Members: map[string]uint64{"orders": 0, "audit": 0}},
			Cursors: map[string]position.Cursor{"reports": {State: "paused", Floor: 50}}},
	}
	require.Equal(t, []PartitionStatus{
		{Partition: 0, Owner: "a", RecordOwner: "a", Epoch: 3, Floor: 100, Written: written, Live: 2, Cursors: map[string]int{"paused": 1}, Asides: 1},
		{Partition: 1, Owner: "b", RecordOwner: "a", Epoch: 2, Floor: 130, Written: written, Live: 2, Cursors: map[string]int{"paused": 1}},
		{Partition: 2, Owner: "a"},
		{Partition: 5, Owner: "gone"},
	}, partitionsOf(parts, leases))

	subs := subscriptionsOf(parts, 140)
	require.Equal(t, []SubscriptionStatus{
		{Name: "audit", SettledUpTo: 120, Behind: 20, Partitions: []SubscriptionPartition{{0, StateLive, 120}, {1, StateLive, 130}}},
		{Name: "orders", SettledUpTo: 100, Behind: 40, Partitions: []SubscriptionPartition{{0, StateLive, 100}, {1, StateLive, 130}}},
		{Name: "reports", SettledUpTo: 40, Behind: 100, Partitions: []SubscriptionPartition{{0, "paused", 40}, {1, "paused", 50}}},
	}, subs)
	require.Equal(t, "paused 2", subs[2].States())
	require.Equal(t, uint64(0), subscriptionsOf(parts, 0)[0].Behind, "no events stream: nothing behind")
}

// Each stuck state says why and the one way out.
func TestExplainStuck(t *testing.T) {
	t.Parallel()
	parked := StuckStream{Subscription: "orders", State: StateParked, From: 7, HeadEventID: "ev-7", Why: "HTTP 422 Unprocessable Entity"}
	explain(&parked)
	require.Equal(t, "HTTP 422 Unprocessable Entity", parked.Why)
	require.Equal(t, "consumer dlq list -s orders names the head's seq N (event ev-7); then consumer dlq replay --seq N once the receiver can take it, "+
		"or consumer dlq skip --seq N to go on without it", parked.Next)

	stuck := StuckStream{Subscription: "orders", State: StateStuck, From: 9, Attempts: 3}
	explain(&stuck)
	require.Equal(t, "3 attempts at its head failed; retried in place", stuck.Why)
	require.Contains(t, stuck.Next, "none needed while the head is retried")

	again := StuckStream{State: StateReadAgain}
	explain(&again)
	require.Contains(t, again.Next, "goes on by itself")

	lost := StuckStream{Subscription: "orders", State: StateOrderStuck, From: 9}
	explain(&lost)
	require.Contains(t, lost.Why, "not in the dead-letter stream")
	require.Contains(t, lost.Next, "(event at sequence 9)")
}
