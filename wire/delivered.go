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
