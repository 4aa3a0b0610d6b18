// Package inspect reads what the consumer left in JetStream, for the
// operator: the ordered subscriptions' ownership and parked streams
// (ReadStatus, `consumer status`) and everything held about one event's
// deliveries (TraceEvent, `consumer trace`). It only reads.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/wire"
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
	// Stuck are the streams that do not go on by themselves (parked,
	// order-stuck) or have not for a while (set aside), by subscription,
	// partition and stream key, each with the way out.
	Stuck []StuckStream
}

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
	var st Status
	type key struct {
		sub string
		p   int
	}
	parts := map[key]*PartitionStatus{}
	part := func(sub string, p int) *PartitionStatus {
		k := key{sub, p}
		if parts[k] == nil {
			parts[k] = &PartitionStatus{Partition: p}
		}
		return parts[k]
	}
	kv, err := js.KeyValue(ctx, wire.DefaultLeaseBucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return st, fmt.Errorf("inspect: lease bucket %q: %w", wire.DefaultLeaseBucket, err)
	default:
		l, err := kv.ListKeys(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
			return st, fmt.Errorf("inspect: list lease bucket %q: %w", wire.DefaultLeaseBucket, err)
		}
		var keys []string
		if l != nil {
			for k := range l.Keys() {
				keys = append(keys, k)
			}
			_ = l.Stop()
		}
		for _, k := range keys {
			e, err := kv.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return st, fmt.Errorf("inspect: read lease %q: %w", k, err)
			}
			if sub, id, ok := wire.ParseMemberKey(k); ok {
				st.Replicas = append(st.Replicas, ReplicaStatus{ID: id, Subscription: sub, Heartbeat: e.Created()})
				continue
			}
			if sub, p, ok := wire.ParseLeaseKey(k); ok {
				part(sub, p).Owner = string(e.Value())
			}
		}
	}
	parked, err := deadletter.ListParked(ctx, js, "")
	if err != nil {
		return st, err
	}
	for _, ps := range parked {
		pt := part(ps.Subscription, ps.Partition)
		pt.Parked++
		if ps.Error != "" {
			pt.AtRisk = append(pt.AtRisk, ps.Stream+": "+ps.Error)
		}
		if ps.OrderStuck {
			pt.OrderStuck = append(pt.OrderStuck, ps.Stream+": "+ps.Reason)
		}
	}
	if st.Stuck, err = stuckOf(ctx, js, parked); err != nil {
		return st, err
	}
	bySub := map[string]*SubscriptionStatus{}
	for k, p := range parts {
		s := bySub[k.sub]
		if s == nil {
			s = &SubscriptionStatus{Name: k.sub}
			bySub[k.sub] = s
		}
		s.Partitions = append(s.Partitions, *p)
	}
	for _, s := range bySub {
		slices.SortFunc(s.Partitions, func(a, b PartitionStatus) int { return a.Partition - b.Partition })
		st.Subscriptions = append(st.Subscriptions, *s)
	}
	slices.SortFunc(st.Subscriptions, func(a, b SubscriptionStatus) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(st.Replicas, func(a, b ReplicaStatus) int {
		if c := strings.Compare(a.Subscription, b.Subscription); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return st, nil
}
