package inspect

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// positionState reads an event's place for a subscription of the shared
// engine from its partition's record (floor, stream entries, asides,
// retries) or its cursor.
func TestPositionState(t *testing.T) {
	t.Parallel()
	const s = "events.order.order-1"
	rec := position.Record{Owner: "r1", Floor: 10, Streams: map[string]position.Entry{s: {Seq: 14}},
		Members: map[string]uint64{"a": 0, "b": 0},
		Asides:  []position.Aside{{Sub: "b", Stream: s, From: 12, State: "parked"}, {Sub: "a", Stream: "events.order.order-2", From: 11, State: "stuck"}},
		Retries: []position.Retry{{Sub: "a", Seq: 20, Attempts: 3}},
	}
	cur := position.Cursor{State: "paused", Floor: 15, Above: []uint64{18}}
	for _, tc := range []struct {
		name, sub, stream string
		seq               uint64
		cursor            bool
		state, why        string
	}{
		{"below the floor", "a", s, 9, false, DeliverySettled, "settled, or not for it: covered by the partition's record (floor 10, owner r1)"},
		{"the stream's entry", "a", s, 14, false, DeliverySettled, "settled, or not for it: covered by the partition's record (floor 10, owner r1)"},
		{"above", "a", s, 15, false, DeliveryPending, "not settled yet: above the partition's floor (10): in flight, waiting for a retry, or not read yet (the record is committed within 200ms)"},
		{"in retry", "a", s, 20, false, DeliveryOutstanding, "failed 3 attempts, waiting for a retry"},
		{"a parked head", "b", s, 12, false, DeliverySettled, "dead-lettered, the head of its parked stream (`consumer dlq replay` or `skip` lets the stream go on)"},
		{"held behind a parked head", "b", s, 13, false, DeliveryPending, "held: its stream is set aside (parked) from sequence 12"},
		{"below a parked head", "b", s, 11, false, DeliverySettled, "settled, or not for it: covered by the partition's record (floor 10, owner r1)"},
		{"a stuck head", "a", "events.order.order-2", 11, false, DeliveryOutstanding, "the head of its stream set aside (stuck): retried in place"},
		{"a cursor's floor", "c", s, 15, true, DeliverySettled, "settled, or not for it: covered by its cursor (paused, floor 15)"},
		{"a cursor's above", "c", s, 18, true, DeliverySettled, "settled, or not for it: covered by its cursor (paused, floor 15)"},
		{"past a cursor", "c", s, 16, true, DeliveryPending, "not settled yet: its cursor (paused) stands at floor 15"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := position.Cursor{}
			if tc.cursor {
				c = cur
			}
			state, why := positionState(rec, c, tc.cursor, tc.sub, tc.stream, tc.seq)
			require.Equal(t, tc.state, state)
			require.Equal(t, tc.why, why)
		})
	}
}

// positionDeliveries lists every subscription the event's partition
// names (members, asides, retries, cursors), from the partition
// wire.SubjectPartition gives among the partitions read, and nothing
// for a record of an events stream made again since.
func TestPositionDeliveries(t *testing.T) {
	t.Parallel()
	subject := wire.Subject(wire.DefaultEventsPrefix, "order-7", "Placed")
	p, ok := wire.SubjectPartition(wire.DefaultEventsPrefix, subject, 4)
	require.True(t, ok)
	parts := make([]position.Stored, 4)
	for i := range parts {
		parts[i] = position.Stored{Partition: i, Record: position.Record{Created: 5, Members: map[string]uint64{"other": 0}}}
	}
	parts[p].Record = position.Record{Created: 5, Floor: 3, Members: map[string]uint64{"live": 0},
		Retries: []position.Retry{{Sub: "retried", Seq: 9, Attempts: 1}}}
	parts[p].Cursors = map[string]position.Cursor{"paused": {State: "paused", Floor: 2}}
	m := EventMessage{Sequence: 3, Subject: subject}
	got := positionDeliveries(parts, wire.DefaultEventsPrefix, 5, m)
	require.Len(t, got, 3)
	for i, want := range []Delivery{
		{Subscription: "live", Partition: p, Key: position.Key(p), Sequence: 3, State: DeliverySettled},
		{Subscription: "paused", Partition: p, Key: position.CursorKey("paused", p), Sequence: 3, State: DeliveryPending},
		{Subscription: "retried", Partition: p, Key: position.Key(p), Sequence: 3, State: DeliverySettled},
	} {
		got[i].Why = ""
		require.Equal(t, want, got[i])
	}
	require.Empty(t, positionDeliveries(parts, wire.DefaultEventsPrefix, 6, m), "another creation of the events stream")
	require.Empty(t, positionDeliveries(nil, wire.DefaultEventsPrefix, 5, m), "no partition read")
}
