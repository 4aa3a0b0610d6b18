package wire

// Lease epochs (HeaderLeaseEpoch) come from one counter per lease bucket's
// users, kept in the park bucket (no TTL), not from the lease bucket's own
// revisions: those start again at 1 whenever the lease bucket is created
// again (by `nats kv add`, infrastructure-as-code, a restore from backup,
// or a replica after an operator deleted it).
const (
	// EpochKey is the park bucket (DefaultParkBucket) key holding the last
	// lease epoch given to a partition claim, base 10. Every claim raises
	// it with a compare-and-set, so epochs only grow for every partition
	// of every ordered subscription, whatever the lease bucket's
	// revisions and whatever the replicas' clocks. One token, so that no
	// park entry pattern of the old engine ("<subscription>.*") matches it.
	EpochKey = "lease-epoch"
	// HeaderOrderEpoch is set by a receiver's order gate on a stale-epoch
	// answer (409, HeaderOrder OrderStaleEpoch): the highest lease epoch
	// it processed for the stream, base 10. The sender raises EpochKey to
	// at least this value before its partition is claimed again, so the
	// next claim's epoch is above anything the receiver saw. A receiver
	// that does not send it gets the epoch doubled at each refusal.
	HeaderOrderEpoch = "Jsbridge-Order-Epoch"
)
