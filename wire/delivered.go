package wire

import "strconv"

// DeliveredKey is the park bucket key of partition p's delivered record
// for an ordered subscription: per stream, the sequence in the
// partitioned copy of the last event its owners answered 2xx or
// dead-lettered, above the partition consumer's ack floor. An owner
// writes it (compare-and-set) before it acks those events, and a new
// owner reads it at take-over: "delivered.<subscription>.<p>" (three
// tokens, so ParkedFilter of a subscription never matches it). It lives
// in the park bucket, which has no TTL: the lease bucket's keys expire
// with a dead owner's lease, and the record must outlive it.
func DeliveredKey(subscription string, p int) string {
	return DeliveredKeyPrefix + subscription + "." + strconv.Itoa(p)
}

// DeliveredKeyPrefix starts every DeliveredKey: listings of the park
// bucket skip these keys.
const DeliveredKeyPrefix = "delivered."

// DeliveredRecord is the value of a DeliveredKey, as JSON: the consumer's
// owners write it, `consumer trace` reads it.
type DeliveredRecord struct {
	// Owner is the replica that wrote it.
	Owner string `json:"owner"`
	// Copy is the partitioned copy's creation time (Unix nanoseconds):
	// a record of another copy (deleted and made again: its sequences
	// start again) is not read.
	Copy int64 `json:"copy"`
	// Streams maps a stream key (StreamKey of the copy's subjects) to
	// the copy sequence of its last event settled.
	Streams map[string]uint64 `json:"streams,omitempty"`
	// Claim is a token drawn by the claim that wrote it, unique to it:
	// a write whose answer was lost but which landed is recognised as
	// the owner's own, not as a new owner's. Empty in records written
	// before it existed.
	Claim string `json:"claim,omitempty"`
}
