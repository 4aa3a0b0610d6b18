package inspect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// deliveries reads where the event m stands for every subscription its
// partition's record or cursor keys in the positions bucket name
// (position.ReadAll). The bucket holds no filters: a subscription whose
// filters do not take the event is listed too, settled by the floor or
// its start. None when the events stream or the bucket does not exist,
// or the bucket holds no record of the events stream as it is now.
func deliveries(ctx context.Context, js jetstream.JetStream, cfg TraceConfig, m EventMessage) ([]Delivery, error) {
	s, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: JetStream stream %q: %w", cfg.Stream, err)
	}
	kv, err := jsapi.ExistingKeyValue(ctx, js, position.DefaultBucket)
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: positions bucket %q: %w", position.DefaultBucket, err)
	}
	if kv == nil {
		return nil, nil
	}
	parts, err := position.ReadAll(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: %w", err)
	}
	return positionDeliveries(parts, cfg.Prefix, s.CachedInfo().Created.UnixNano(), m), nil
}

// positionDeliveries is deliveries of the partitions read, parts, of
// the events stream created at created (Unix ns): the event's partition is wire.SubjectPartition of its subject among
// as many partitions as the highest one read plus one (every replica
// runs with the same count, and each partition has a record once
// claimed). A pure function.
func positionDeliveries(parts []position.Stored, prefix string, created int64, m EventMessage) []Delivery {
	if len(parts) == 0 {
		return nil
	}
	n := parts[len(parts)-1].Partition + 1
	p, ok := wire.SubjectPartition(prefix, m.Subject, n)
	if !ok {
		return nil
	}
	i := slices.IndexFunc(parts, func(s position.Stored) bool { return s.Partition == p })
	if i < 0 {
		return nil
	}
	st := parts[i]
	if c := st.Record.Created; c != 0 && created != 0 && c != created {
		return nil // the record of an events stream deleted since
	}
	subs := map[string]bool{}
	rec := st.Record
	for s := range rec.Members {
		subs[s] = true
	}
	for s := range rec.Ahead {
		subs[s] = true
	}
	for _, a := range rec.Asides {
		subs[a.Sub] = true
	}
	for _, r := range rec.Retries {
		subs[r.Sub] = true
	}
	for s := range st.Cursors {
		subs[s] = true
	}
	stream := wire.StreamKey(m.Subject)
	var out []Delivery
	for _, sub := range slices.Sorted(maps.Keys(subs)) {
		d := Delivery{Subscription: sub, Partition: p, Key: position.Key(p), Sequence: m.Sequence}
		c, hasCursor := st.Cursors[sub]
		if hasCursor {
			d.Key = position.CursorKey(sub, p)
		}
		d.State, d.Why = positionState(rec, c, hasCursor, sub, stream, m.Sequence)
		out = append(out, d)
	}
	return out
}

// positionState is where the event at seq of stream stands for sub on a
// partition whose record is rec; c is sub's cursor when hasCursor (it is
// not live). A pure function.
func positionState(rec position.Record, c position.Cursor, hasCursor bool, sub, stream string, seq uint64) (state, why string) {
	for _, a := range rec.Asides {
		if a.Sub != sub || a.Stream != stream || a.From > seq {
			continue
		}
		switch {
		case a.From < seq:
			return DeliveryPending, fmt.Sprintf("held: its stream is set aside (%s) from sequence %d", a.State, a.From)
		case a.State == fanout.AsideParked:
			return DeliverySettled, "dead-lettered, the head of its parked stream (`consumer dlq replay` or `skip` lets the stream go on)"
		case a.State == fanout.AsideStuck:
			return DeliveryOutstanding, "the head of its stream set aside (stuck): retried in place"
		}
		// Reading again from its head (after an operator's request).
		return DeliveryPending, fmt.Sprintf("its stream is read again (%s) from sequence %d", a.State, a.From)
	}
	for _, r := range rec.Retries {
		if r.Sub == sub && r.Seq == seq {
			return DeliveryOutstanding, fmt.Sprintf("failed %d attempts, waiting for a retry", r.Attempts)
		}
	}
	if hasCursor {
		if c.Covers(stream, seq) {
			return DeliverySettled, fmt.Sprintf("settled, or not for it: covered by its cursor (%s, floor %d)", c.State, c.Floor)
		}
		return DeliveryPending, fmt.Sprintf("not settled yet: its cursor (%s) stands at floor %d", c.State, c.Floor)
	}
	if rec.Covers(sub, stream, seq) {
		return DeliverySettled, fmt.Sprintf("settled, or not for it: covered by the partition's record (floor %d, owner %s)", rec.Floor, rec.Owner)
	}
	return DeliveryPending, fmt.Sprintf("not settled yet: above the partition's floor (%d): in flight, waiting for a retry, or not read yet (the record is committed within %s)",
		rec.Floor, position.DefaultLinger)
}
