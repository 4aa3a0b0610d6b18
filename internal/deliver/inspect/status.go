// Package inspect reads what the consumer left in JetStream, for the
// operator: the replicas, partitions, subscriptions' positions and stuck
// streams of the shared engine (ReadStatus, `consumer status`) and
// everything held about one event's deliveries (TraceEvent, `consumer
// trace`). It only reads.
package inspect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// StatusConfig says where ReadStatus reads.
type StatusConfig struct {
	// EventsStream is the events stream, whose last sequence the
	// subscriptions' positions are measured against, and whose messages
	// name the heads of the stuck streams. Default wire.DefaultEventsStream.
	EventsStream string
	// DLQStream is the dead-letter stream, whose letters describe the
	// parked heads. Default: the dead-letter stream's default.
	DLQStream string
}

// Status is the shared engine as its buckets hold it: what `consumer
// status` prints, and (these JSON keys) what `consumer status --json`
// prints.
type Status struct {
	// LastSeq is the events stream's last sequence (0: the stream is
	// empty or does not exist): what SubscriptionStatus.Behind counts to.
	LastSeq uint64 `json:"last_seq"`
	// Replicas are the live replicas (their heartbeat key in the lease
	// bucket not expired), by id.
	Replicas []ReplicaStatus `json:"replicas"`
	// Partitions are the partitions with a lease, a record or a cursor,
	// by partition.
	Partitions []PartitionStatus `json:"partitions"`
	// Subscriptions are the subscriptions a record or a cursor names, by
	// name.
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
	// Stuck are the streams set aside by the records (parked,
	// order-stuck, stuck, read again), by subscription, partition and
	// stream key, each with the way out.
	Stuck []StuckStream `json:"stuck"`
	// Positions are the positions bucket's records and cursor keys as
	// read (position.ReadAll), whole.
	Positions []position.Stored `json:"positions,omitempty"`
}

// ReplicaStatus is one live consumer replica: its heartbeat key
// member.<id> in the lease bucket, and the partitions whose lease key
// names it.
type ReplicaStatus struct {
	ID string `json:"id"`
	// Heartbeat is its heartbeat key's last write (server time); Age is
	// StatusConfig.Now minus Heartbeat (nanoseconds in JSON).
	Heartbeat time.Time     `json:"heartbeat"`
	Age       time.Duration `json:"age"`
	// Partitions are the partitions it holds the lease of, ascending.
	Partitions []int `json:"partitions"`
}

// PartitionStatus is one partition: its lease's owner, its record
// (epoch, floor, when written) and where its subscriptions stand.
type PartitionStatus struct {
	Partition int `json:"partition"`
	// Owner is the replica holding the partition's lease ("" when none
	// does: expired, or never claimed); RecordOwner the replica that last
	// wrote its record (it differs from Owner only during a hand-over).
	Owner       string `json:"owner,omitempty"`
	RecordOwner string `json:"record_owner,omitempty"`
	// Epoch is the record's lease epoch; Floor the sequence at or below
	// which every event of the partition was settled for its live
	// subscriptions (or is covered by an aside, a retry or a cursor).
	Epoch uint64 `json:"epoch"`
	Floor uint64 `json:"floor"`
	// Written is the record's last write (zero: no record yet).
	Written time.Time `json:"written,omitzero"`
	// Live is how many subscriptions read the partition in the shared
	// read (the record's members); Cursors counts the others by their
	// cursor's state ("behind", "paused", "disabled", "breaker",
	// "throttled", "held").
	Live    int            `json:"live"`
	Cursors map[string]int `json:"cursors,omitempty"`
	// Asides and Retries count the record's streams set aside and events
	// with failed attempts.
	Asides  int `json:"asides"`
	Retries int `json:"retries"`
}

// SubscriptionStatus is where one subscription stands: on each partition
// and at the lowest.
type SubscriptionStatus struct {
	Name string `json:"name"`
	// SettledUpTo is the lowest of Partitions' SettledUpTo: every event
	// it takes at or below it is settled (answered 2xx or
	// dead-lettered), but for its streams set aside (Status.Stuck).
	SettledUpTo uint64 `json:"settled_up_to"`
	// Behind is Status.LastSeq minus SettledUpTo (0 when not above): the
	// events stream's sequences above its lowest position, its own events
	// and others' (an upper bound on its backlog).
	Behind uint64 `json:"behind"`
	// Partitions are its positions, by partition.
	Partitions []SubscriptionPartition `json:"partitions"`
}

// SubscriptionPartition is one subscription's position on one partition.
type SubscriptionPartition struct {
	Partition int `json:"partition"`
	// State is "live" (a member of the record: it goes with the shared
	// read) or its cursor's state ("behind", "paused", "disabled",
	// "breaker", "throttled", "held").
	State string `json:"state"`
	// SettledUpTo is the sequence at or below which every event of the
	// partition it takes is settled: the record's floor or its member
	// entry above it (live), the cursor's floor (not live).
	SettledUpTo uint64 `json:"settled_up_to"`
}

// StateLive is SubscriptionPartition.State of a member of the record.
const StateLive = "live"

// ReadStatus reads the lease bucket (heartbeats and partition leases),
// the positions bucket (records and cursor keys), the events stream's
// last sequence and, for the stuck streams, their heads' messages and
// dead letters. Missing buckets and streams read as empty (no consumer
// ran yet). It writes nothing. Errors are the buckets' and streams', and
// a record or cursor that cannot be decoded (position.ErrCorrupt,
// naming its key).
func ReadStatus(ctx context.Context, arch *base.Archetype, js jetstream.JetStream, cfg StatusConfig) (Status, error) {
	cfg.EventsStream = cmp.Or(cfg.EventsStream, wire.DefaultEventsStream)
	now := base.Default(arch).Clock.Now()
	var st Status
	beats, leases, err := readLeases(ctx, js)
	if err != nil {
		return st, err
	}
	kv, err := jsapi.ExistingKeyValue(ctx, js, position.DefaultBucket)
	switch {
	case err != nil:
		return st, fmt.Errorf("inspect: positions bucket %q: %w", position.DefaultBucket, err)
	case kv != nil:
		if st.Positions, err = position.ReadAll(ctx, kv); err != nil {
			return st, fmt.Errorf("inspect: %w", err)
		}
	}
	events, err := js.Stream(ctx, cfg.EventsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		events = nil
	case err != nil:
		return st, fmt.Errorf("inspect: events stream %q: %w", cfg.EventsStream, err)
	default:
		info, err := events.Info(ctx)
		if err != nil {
			return st, fmt.Errorf("inspect: events stream %q: %w", cfg.EventsStream, err)
		}
		st.LastSeq = info.State.LastSeq
	}
	st.Replicas = replicasOf(beats, leases, now)
	st.Partitions = partitionsOf(st.Positions, leases)
	st.Subscriptions = subscriptionsOf(st.Positions, st.LastSeq)
	st.Stuck, err = stuckOf(ctx, js, events, cfg.DLQStream, st.Positions)
	return st, err
}

// readLeases reads the shared engine's keys in the lease bucket: each
// replica's heartbeat (its last write, by replica id) and each
// partition's lease (its owner, by partition). None when the bucket does
// not exist.
func readLeases(ctx context.Context, js jetstream.JetStream) (beats map[string]time.Time, leases map[int]string, err error) {
	beats, leases = map[string]time.Time{}, map[int]string{}
	kv, err := jsapi.ExistingKeyValue(ctx, js, wire.DefaultLeaseBucket)
	if err != nil {
		return nil, nil, fmt.Errorf("inspect: lease bucket %q: %w", wire.DefaultLeaseBucket, err)
	}
	if kv == nil {
		return beats, leases, nil
	}
	keys, err := jsapi.Keys(ctx, kv, owner.MemberFilter, owner.LeaseFilter)
	if err != nil {
		return nil, nil, fmt.Errorf("inspect: %w", err)
	}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired since the listing
		}
		if err != nil {
			return nil, nil, fmt.Errorf("inspect: read lease bucket key %q: %w", k, err)
		}
		if id, ok := owner.ParseMemberKey(k); ok {
			beats[id] = e.Created()
		} else if p, ok := owner.ParseLeaseKey(k); ok {
			leases[p] = string(e.Value())
		}
	}
	return beats, leases, nil
}

// replicasOf is Status.Replicas of the heartbeats and leases read, at
// now. A pure function.
func replicasOf(beats map[string]time.Time, leases map[int]string, now time.Time) []ReplicaStatus {
	out := []ReplicaStatus{}
	for _, id := range slices.Sorted(maps.Keys(beats)) {
		r := ReplicaStatus{ID: id, Heartbeat: beats[id], Age: max(now.Sub(beats[id]), 0), Partitions: []int{}}
		for _, p := range slices.Sorted(maps.Keys(leases)) {
			if leases[p] == id {
				r.Partitions = append(r.Partitions, p)
			}
		}
		out = append(out, r)
	}
	return out
}

// partitionsOf is Status.Partitions of the positions and leases read. A
// pure function.
func partitionsOf(parts []position.Stored, leases map[int]string) []PartitionStatus {
	byP := map[int]*PartitionStatus{}
	for p, o := range leases {
		byP[p] = &PartitionStatus{Partition: p, Owner: o}
	}
	for _, s := range parts {
		ps := byP[s.Partition]
		if ps == nil {
			ps = &PartitionStatus{Partition: s.Partition}
			byP[s.Partition] = ps
		}
		r := s.Record
		ps.RecordOwner, ps.Epoch, ps.Floor, ps.Written = r.Owner, r.Epoch, r.Floor, s.Updated
		ps.Live, ps.Asides, ps.Retries = len(r.Members), len(r.Asides), len(r.Retries)
		for sub, c := range s.Cursors {
			if _, member := r.Members[sub]; member {
				continue // stale: the record still lists it
			}
			if ps.Cursors == nil {
				ps.Cursors = map[string]int{}
			}
			ps.Cursors[c.State]++
		}
	}
	out := []PartitionStatus{}
	for _, p := range slices.Sorted(maps.Keys(byP)) {
		out = append(out, *byP[p])
	}
	return out
}

// subscriptionsOf is Status.Subscriptions of the positions read, against
// the events stream's last sequence. A pure function.
func subscriptionsOf(parts []position.Stored, last uint64) []SubscriptionStatus {
	bySub := map[string][]SubscriptionPartition{}
	for _, s := range parts {
		for sub, from := range s.Record.Members {
			bySub[sub] = append(bySub[sub], SubscriptionPartition{Partition: s.Partition, State: StateLive, SettledUpTo: max(s.Record.Floor, from)})
		}
		for sub, c := range s.Cursors {
			if _, member := s.Record.Members[sub]; member {
				continue // stale: the record still lists it (position: cursors first)
			}
			bySub[sub] = append(bySub[sub], SubscriptionPartition{Partition: s.Partition, State: c.State, SettledUpTo: c.Floor})
		}
	}
	out := []SubscriptionStatus{}
	for _, name := range slices.Sorted(maps.Keys(bySub)) {
		ps := bySub[name]
		slices.SortFunc(ps, func(a, b SubscriptionPartition) int { return cmp.Compare(a.Partition, b.Partition) })
		s := SubscriptionStatus{Name: name, Partitions: ps, SettledUpTo: ps[0].SettledUpTo}
		for _, p := range ps {
			s.SettledUpTo = min(s.SettledUpTo, p.SettledUpTo)
		}
		if last > s.SettledUpTo {
			s.Behind = last - s.SettledUpTo
		}
		out = append(out, s)
	}
	return out
}

// States counts a subscription's partitions by state: "live 3, paused 1".
func (s SubscriptionStatus) States() string {
	n := map[string]int{}
	for _, p := range s.Partitions {
		n[p.State]++
	}
	var parts []string
	for _, st := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s %d", st, n[st]))
	}
	return strings.Join(parts, ", ")
}
