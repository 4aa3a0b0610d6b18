package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// Status is the delivery engine as its buckets hold it: the live
// replicas, the partitions, where each subscription stands and the
// stuck streams. It is what `consumer status` prints, and `consumer
// status --json` prints it with these JSON keys:
//
//	{"last_seq": 120,
//	 "replicas": [{"id", "heartbeat" (RFC 3339), "age" (ns), "partitions": [0, 2]}],
//	 "partitions": [{"partition", "owner", "record_owner", "epoch", "floor", "written",
//	                 "live", "cursors": {"paused": 1}, "asides", "retries"}],
//	 "subscriptions": [{"name", "settled_up_to", "behind",
//	                    "partitions": [{"partition", "state", "settled_up_to"}]}],
//	 "stuck": [{"subscription", "partition", "state", "stream", "stream_key", "from",
//	            "head_event_id", "head_version", "since", "attempts", "why", "next"}],
//	 "positions": [position records and cursors, decoded (SharedPosition)]}
type Status = inspect.Status

// ReplicaStatus is one live consumer replica: its heartbeat (its key
// member.<id> in the lease bucket), the heartbeat's age and the
// partitions it holds the lease of.
type ReplicaStatus = inspect.ReplicaStatus

// PartitionStatus is one partition: the replica holding its lease, its
// record's epoch, floor and last write, and its subscriptions counted
// live or by their cursors' states.
type PartitionStatus = inspect.PartitionStatus

// SubscriptionStatus is where one subscription stands: the sequence up
// to which it settled on each partition, the lowest of them, and how far
// that is below the events stream's last sequence.
type SubscriptionStatus = inspect.SubscriptionStatus

// SubscriptionPartition is one subscription's position on one partition:
// live (the shared read) or its cursor's state, and the sequence up to
// which it settled.
type SubscriptionPartition = inspect.SubscriptionPartition

// StuckStream is a stream of a subscription that a partition's record
// sets aside: parked, order-stuck, stuck (its head retried in place) or
// read again, with its head (sequence, event id, version), since when,
// why, and the command out (Next).
type StuckStream = inspect.StuckStream

// The states of StuckStream.State (docs/ordering.md, "Nothing sticks for
// ever"), and SubscriptionPartition.State of a live subscription.
const (
	StateParked     = inspect.StateParked
	StateOrderStuck = inspect.StateOrderStuck
	StateStuck      = inspect.StateStuck
	StateReadAgain  = inspect.StateReadAgain
	StateLive       = inspect.StateLive
)

// StatusConfig says where ReadStatus reads: the events stream (default
// DefaultStream) and the dead-letter stream (default DefaultDLQStream).
// The heartbeats' ages are taken at the time ReadStatus reads.
type StatusConfig = inspect.StatusConfig

// ReadStatus reads the lease bucket, the positions bucket, the events
// stream's last sequence and the stuck streams' heads and dead letters
// on js, writing nothing. Missing buckets and streams read as empty (no
// consumer ran yet). Errors are the server's, and a record or cursor
// that cannot be decoded (wrapping position.ErrCorrupt, naming its key).
func ReadStatus(ctx context.Context, js jetstream.JetStream, cfg StatusConfig) (Status, error) {
	return inspect.ReadStatus(ctx, nil, js, cfg)
}

// SharedPosition is one partition of the delivery engine's positions
// bucket (jsbridge_positions; docs/design/next-engine.md, D4): its
// record (owner, claim, epoch, floor, per-stream entries, members,
// streams set aside, retries) and its subscriptions' cursors, decoded
// from their binary encoding (Status.Positions).
type SharedPosition = position.Stored

// ReadSharedPositions reads every partition of the positions bucket, in
// partition order, without claiming or writing anything. It returns none
// when the bucket does not exist; errors are the bucket's, or a record
// or cursor that cannot be decoded (naming its key).
func ReadSharedPositions(ctx context.Context, js jetstream.JetStream) ([]SharedPosition, error) {
	kv, err := js.KeyValue(ctx, position.DefaultBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the positions bucket %q: %w", position.DefaultBucket, err)
	}
	return position.ReadAll(ctx, kv)
}
