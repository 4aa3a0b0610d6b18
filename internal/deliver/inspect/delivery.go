package inspect

// Where an event stands for one subscription (Delivery.State), as the
// positions bucket says.
const (
	// DeliverySettled: answered 2xx or dead-lettered (the trace's dead
	// letters tell which), or covered by the partition's floor or the
	// subscription's cursor without being for it (the bucket holds no
	// filters), or before the subscription's start.
	DeliverySettled = "settled"
	// DeliveryOutstanding: read and not settled: in flight, or waiting
	// for a retry, or the head of a stream set aside and retried in place.
	DeliveryOutstanding = "outstanding"
	// DeliveryPending: not settled yet and not known to be in hand:
	// above the partition's floor, behind its subscription's cursor, or
	// held behind a stream set aside.
	DeliveryPending = "pending"
)

// Delivery is where the event stands for one subscription its
// partition's record or cursor keys name, read from the positions
// bucket. It is what `consumer trace` knows of an event with no attempt
// record: under attemptlog.ModeFailures a success on the first attempt
// leaves none.
type Delivery struct {
	// Subscription is the subscription's name.
	Subscription string `json:"subscription"`
	// Partition is the event's partition.
	Partition int `json:"partition"`
	// Sequence is the event's sequence on the events stream.
	Sequence uint64 `json:"sequence"`
	// Key is the positions bucket key State was read from: the
	// partition's record (pos.p<N>), or the subscription's cursor key
	// there (cur.<subscription>.p<N>) while it is not live. The bucket
	// holds no filters: a settled State may be an event the subscription
	// does not take.
	Key string `json:"key"`
	// State is DeliverySettled, DeliveryOutstanding or DeliveryPending.
	State string `json:"state"`
	// Why says what State was read from, e.g. "settled, or not for it:
	// covered by the partition's record (floor 1041, owner r1)".
	Why string `json:"why"`
}
