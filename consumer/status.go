package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// Status is the ordered subscriptions' ownership as the lease bucket holds
// it: what `consumer status` prints.
type Status struct {
	// Replicas are the live replicas (heartbeat not expired), per ordered
	// subscription they run, by subscription and id.
	Replicas []ReplicaStatus
	// Subscriptions are the ordered subscriptions with at least one
	// partition lease or parked stream, by name.
	Subscriptions []SubscriptionStatus
	// Stuck are the ordered subscriptions' streams that do not go on by
	// themselves (parked, order-stuck) or have not for a while (set
	// aside), by subscription, partition and stream key, each with the
	// way out.
	Stuck []StuckStream
}

// StuckStream is a stream of an ordered subscription that does not go on
// by itself (parked, order-stuck) or has not for a while (set aside):
// its partition, head (event id and version), since when, the
// receiver's answer that stuck it and the command out (Next).
type StuckStream = inspect.StuckStream

// The states of StuckStream.State (docs/ordering.md, "Nothing sticks for
// ever").
const (
	StateOrderStuck = inspect.StateOrderStuck
	StateParked     = inspect.StateParked
	StateSetAside   = inspect.StateSetAside
)

// ReplicaStatus is one live replica of one ordered subscription.
type ReplicaStatus struct {
	ID           string
	Subscription string
	Heartbeat    time.Time // its last heartbeat
}

// SubscriptionStatus is one ordered subscription's partitions.
type SubscriptionStatus struct {
	Name       string
	Partitions []PartitionStatus // by partition; only those with a lease or a parked stream
}

// PartitionStatus is one partition: its owner ("" when no replica holds
// its lease), how many of its streams are parked, and the causes its
// parked streams' entries record for held events nearing or past the
// partitioned copy's MaxAge ("stream: cause", see ParkedStream.Error).
type PartitionStatus struct {
	Partition int
	Owner     string
	Parked    int
	AtRisk    []string
	// OrderStuck names the parked streams in the order-stuck state: their
	// head was refused by the receiver's order gate for longer than the
	// consumer's OrderStuckAfter ("stream: reason", see
	// ParkedStream.OrderStuck).
	OrderStuck []string
}

// ReadStatus reads the lease and park buckets on js. Missing buckets
// read as empty (no ordered subscription ran yet).
func ReadStatus(ctx context.Context, js jetstream.JetStream) (Status, error) {
	st, err := inspect.ReadStatus(ctx, js)
	var out Status
	for _, r := range st.Replicas {
		out.Replicas = append(out.Replicas, ReplicaStatus(r))
	}
	for _, s := range st.Subscriptions {
		ss := SubscriptionStatus{Name: s.Name}
		for _, p := range s.Partitions {
			ss.Partitions = append(ss.Partitions, PartitionStatus(p))
		}
		out.Subscriptions = append(out.Subscriptions, ss)
	}
	out.Stuck = st.Stuck
	return out, err
}

// SharedPosition is one partition of the shared delivery engine's
// positions bucket (jsbridge_positions; docs/design/next-engine.md, D4):
// its record (owner, claim, epoch, floor, per-stream entries, members,
// streams set aside, retries) and its subscriptions' cursors, decoded
// from their binary encoding. The engine that writes it is being built
// and no released consumer runs it yet; `consumer status` shows it when
// the bucket exists.
type SharedPosition = position.Stored

// ReadSharedPositions reads every partition of the shared engine's
// positions bucket, in partition order, without claiming or writing
// anything. It returns none when the bucket does not exist; errors are
// the bucket's, or a record or cursor that cannot be decoded (naming its
// key).
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
