package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// Ordered delivery (ordering "stream") splits the streams between consumer
// replicas by partition: Partition of the stream token, P partitions, each
// owned by one replica at a time through a lease. The names of the
// partitioned copy of the events stream that the durables engine read
// (gone at stage 8 of docs/design/next-engine.md) are package
// internal/migrate/legacy's, but for OrderedStream, which a
// deployment not yet moved still has.
const (
	// DefaultLeaseBucket is the JetStream key-value bucket holding the
	// consumer replicas' membership heartbeats and partition leases (keys
	// expire after the bucket's TTL unless renewed).
	DefaultLeaseBucket = "jsbridge_leases"
	// DefaultParkBucket is the JetStream key-value bucket holding the parked
	// streams of ordered subscriptions (no TTL: a parked stream stays parked
	// until an operator replays or skips its head).
	DefaultParkBucket = "jsbridge_parked"
	// HeaderReplica carries the consumer replica's id on every webhook of
	// an ordered subscription, so a receiver (or a test) can see who sent it.
	HeaderReplica = "Jsbridge-Replica"
	// HeaderPartition carries, on every webhook of an ordered subscription,
	// the partition (0 … P-1, base 10) the event's stream hashes to
	// (StreamPartition of ce-subject).
	HeaderPartition = "Jsbridge-Partition"
	// HeaderLeaseEpoch carries, beside HeaderPartition, the sending
	// replica's partition-lease epoch (a uint64, base 10): each claim of a
	// partition takes the next value of one counter (EpochKey in the park
	// bucket, raised with compare-and-set), so for one stream the epoch
	// only grows, whoever created the lease bucket and whatever the
	// replicas' clocks; a lower epoch than one a receiver already
	// processed for the stream comes from a stale (zombie) sender.
	HeaderLeaseEpoch = "Jsbridge-Lease-Epoch"
	// HeaderPreviousVersion carries, on every webhook of an ordered
	// subscription and on every path that sends one (the partition's head
	// of line, dead-letter replay, replay by time, the event after a
	// skip), the version of the same stream that this subscription
	// delivered (answered 2xx) before this one, base 10, or PreviousNone
	// when it delivered none of that stream before. With the stream and
	// the version it forms the version chain: a receiver's order gate
	// processes version v when its previous version is the last one it
	// processed. Format and parse it with FormatPreviousVersion and
	// ParsePreviousVersion.
	HeaderPreviousVersion = "Jsbridge-Previous-Version"
	// HeaderOrderSignature carries the signature of an ordered webhook's
	// ordering fields (message id, timestamp, previous version, version,
	// partition, epoch, stream), made with the subscription's own secrets
	// and scheme: the body's signature does not cover headers. Package
	// webhook signs (Signer.SignOrder) and verifies (Verifier.VerifyOrder)
	// it; docs/wire.md gives the signed content.
	HeaderOrderSignature = "Jsbridge-Order-Signature"
	// HeaderOrderLast is set by a receiver's order gate on its gap
	// answers: the last version of the stream it processed, base 10, or
	// PreviousNone when it processed none, so the sender and the operator
	// see what the receiver expects as the next request's previous
	// version.
	HeaderOrderLast = "Jsbridge-Order-Last"
	// HeaderOrder is set by a receiver's order gate (package webhook) on the
	// answers it gives without running the receiver's handler: one of
	// OrderDuplicate (with a 2xx), OrderGap, OrderInProgress or
	// OrderStaleEpoch (with 409 Conflict and Retry-After). See
	// OrderRetryInPlace.
	HeaderOrder = "Jsbridge-Order"
)

// HeaderOrder values.
const (
	// OrderDuplicate: the version was already processed (an at-least-once
	// duplicate); answered 2xx, the receiver's handler not called. The
	// sender acks.
	OrderDuplicate = "duplicate"
	// OrderGap: the version is ahead of the next one the receiver expects
	// (its predecessor is neither processed nor, for a receiver that starts
	// every stream at 0, is it version 0); answered 409 with Retry-After.
	// The sender retries the event in place, never dead-letters it.
	OrderGap = "gap"
	// OrderInProgress: the version is the next one, but another request of
	// its stream is being processed right now (usually an earlier attempt
	// of this very version); answered 409 with Retry-After. The sender
	// retries in place.
	OrderInProgress = "in-progress"
	// OrderStaleEpoch: HeaderLeaseEpoch is below the highest epoch the
	// receiver processed for the stream, so the sender lost its partition
	// lease; answered 409 with Retry-After, never processed. The sender
	// stops the partition (released; nothing acked, nothing dead-lettered):
	// the new owner delivers the event.
	OrderStaleEpoch = "stale-epoch"
	// HeaderSourceInfo is set by JetStream on a sourced message: "<origin
	// stream> <origin sequence> <filter> <transform> ..." (nats-server
	// stream.go, JSStreamSource).
	HeaderSourceInfo = "Nats-Stream-Source"
)

// PreviousNone is the HeaderPreviousVersion (and HeaderOrderLast) value
// saying "no version of this stream": the subscription delivered none
// before, or the receiver processed none.
const PreviousNone = "none"

// FormatPreviousVersion returns the HeaderPreviousVersion value of the
// previous version v: v in base 10, or PreviousNone when v < 0.
func FormatPreviousVersion(v int64) string {
	if v < 0 {
		return PreviousNone
	}
	return strconv.FormatInt(v, 10)
}

// ParsePreviousVersion reverses FormatPreviousVersion: PreviousNone gives
// -1, a base-10 integer >= 0 gives itself. Anything else (empty, negative,
// signed, spaces) is an error naming the header and the value.
func ParsePreviousVersion(s string) (int64, error) {
	if s == PreviousNone {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || strconv.FormatInt(v, 10) != s {
		return 0, fmt.Errorf("bad %s %q: want %q or a version >= 0 in base 10", HeaderPreviousVersion, s, PreviousNone)
	}
	return v, nil
}

// OrderRetryInPlace reports whether a HeaderOrder value refuses the event
// for now (OrderGap, OrderInProgress, OrderStaleEpoch): the sender never
// dead-letters it, although the status is 409. An ordered subscription's
// sender retries a gap or in-progress in place, after Retry-After, and
// stops its partition on a stale epoch. OrderDuplicate and any other value
// report false.
func OrderRetryInPlace(value string) bool {
	switch value {
	case OrderGap, OrderInProgress, OrderStaleEpoch:
		return true
	}
	return false
}

// OrderedStream returns the name of the partitioned copy of the JetStream
// stream events: "<events>_ORDERED".
func OrderedStream(events string) string { return events + "_ORDERED" }

// Partition returns the partition of the stream whose subject token (as
// EscapeToken writes it) is streamToken: fnv32a(streamToken) % partitions,
// as nats-server's {{partition(n,i)}} computes it.
func Partition(streamToken string, partitions int) int {
	if partitions <= 0 {
		return 0
	}
	return int(fnv32a(streamToken) % uint32(partitions))
}

// fnv32a is hash/fnv's 32-bit FNV-1a of s, written out so that hashing a
// subject's token on every message copies and allocates nothing.
func fnv32a(s string) uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime32
	}
	return h
}

// SubjectPartition returns the partition of the event stored on subject
// under prefix ("<prefix>.<category>.<stream>.<name>", as Subject writes
// it): Partition of its stream token, the second token after prefix,
// without unescaping or checking the others (a consumer replica's reader
// computes it for every event of the events stream, its own or not).
// ok is false, and p 0, when subject is not prefix + "." + three
// non-empty tokens.
func SubjectPartition(prefix, subject string, partitions int) (p int, ok bool) {
	rest, found := strings.CutPrefix(subject, prefix)
	if !found || len(rest) < 2 || rest[0] != '.' {
		return 0, false
	}
	cat, rest, found := strings.Cut(rest[1:], ".")
	if !found || cat == "" {
		return 0, false
	}
	stream, name, found := strings.Cut(rest, ".")
	if !found || stream == "" || name == "" || strings.IndexByte(name, '.') >= 0 {
		return 0, false
	}
	return Partition(stream, partitions), true
}

// StreamPartition returns the partition of the source stream named stream.
func StreamPartition(stream string, partitions int) int {
	return Partition(EscapeToken(stream), partitions)
}

// SourceSequence returns the origin sequence a Nats-Stream-Source header
// value carries (its second field), or 0 when it has none.
func SourceSequence(v string) uint64 {
	f := strings.Fields(v)
	if len(f) < 2 {
		return 0
	}
	n, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
