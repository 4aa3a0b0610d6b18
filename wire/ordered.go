package wire

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Ordered delivery (deliver's ordering "stream") reads a partitioned copy of
// the events stream: a JetStream stream that sources the events stream with
// a subject transform adding a partition token, so that P durable pull
// consumers, one per partition, split the streams between consumer replicas
// while the events stream's own subjects stay as they are.
//
// Stored subject: "ordered.<events prefix>.<partition>.<category>.<stream>.<name>",
// the last three tokens copied from the event's subject; partition is
// Partition(stream token, P).
const (
	// OrderedPrefixToken is the first token of a partitioned copy's subjects.
	OrderedPrefixToken = "ordered"
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

// OrderedPrefix returns the subject prefix of the partitioned copy of the
// events under eventsPrefix: "ordered.<eventsPrefix>".
func OrderedPrefix(eventsPrefix string) string { return OrderedPrefixToken + "." + eventsPrefix }

// OrderedTransform returns the source filter and the destination of the
// subject transform that copies "<eventsPrefix>.<category>.<stream>.<name>"
// to "ordered.<eventsPrefix>.<partition>.<category>.<stream>.<name>" with
// partitions partitions, in nats-server's transform syntax: the partition
// is fnv32a of the stream token (wildcard 2) modulo partitions, which
// Partition reproduces.
func OrderedTransform(eventsPrefix string, partitions int) (src, dest string) {
	return eventsPrefix + ".*.*.*",
		fmt.Sprintf("%s.{{partition(%d,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}", OrderedPrefix(eventsPrefix), partitions)
}

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

// OrderedFilter translates a subscription's filter on the events
// ("<eventsPrefix>.order.>", "<eventsPrefix>.*.*.OrderPlaced",
// "<eventsPrefix>.>") into the same filter on one partition of the
// partitioned copy ("ordered.<eventsPrefix>.<partition>.order.>", ...). It
// fails, wrapping ErrInvalidSubject, when filter does not start with
// "<eventsPrefix>.".
func OrderedFilter(eventsPrefix string, partition int, filter string) (string, error) {
	rest, ok := strings.CutPrefix(filter, eventsPrefix+".")
	if !ok || rest == "" {
		return "", fmt.Errorf("%w: filter %q does not start with the events prefix %q: an ordered subscription can only filter on the events' subjects", ErrInvalidSubject, filter, eventsPrefix+".")
	}
	return OrderedPrefix(eventsPrefix) + "." + strconv.Itoa(partition) + "." + rest, nil
}

// EventsSubject returns the events stream's subject of a message of the
// partitioned copy: "ordered.<eventsPrefix>.<p>.<rest>" becomes
// "<eventsPrefix>.<rest>". A subject not under the copy's prefix is
// returned as it is.
func EventsSubject(eventsPrefix, subject string) string {
	rest, ok := strings.CutPrefix(subject, OrderedPrefix(eventsPrefix)+".")
	if !ok {
		return subject
	}
	if _, after, ok := strings.Cut(rest, "."); ok {
		return eventsPrefix + "." + after
	}
	return subject
}

// PartitionDurable returns the durable consumer name of one partition of
// an ordered subscription: "<subscription>_p<partition>".
func PartitionDurable(subscription string, partition int) string {
	return subscription + "_p" + strconv.Itoa(partition)
}

// ParsePartitionDurable reverses PartitionDurable.
func ParsePartitionDurable(durable string) (subscription string, partition int, ok bool) {
	i := strings.LastIndex(durable, "_p")
	if i <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(durable[i+2:])
	if err != nil || p < 0 || strconv.Itoa(p) != durable[i+2:] {
		return "", 0, false
	}
	return durable[:i], p, true
}

// MemberKey is the lease bucket key a consumer replica heartbeats for each
// ordered subscription it runs: "member.<subscription>.<replica id>" (both
// made of KV key characters). Partitions are shared among the replicas
// that run the subscription.
func MemberKey(subscription, replica string) string { return "member." + subscription + "." + replica }

// MemberFilter matches the MemberKeys of subscription, or of every
// subscription when it is empty.
func MemberFilter(subscription string) string {
	if subscription == "" {
		return "member.>"
	}
	return "member." + subscription + ".*"
}

// ParseMemberKey reverses MemberKey.
func ParseMemberKey(key string) (subscription, replica string, ok bool) {
	rest, ok := strings.CutPrefix(key, "member.")
	if !ok {
		return "", "", false
	}
	subscription, replica, ok = strings.Cut(rest, ".")
	return subscription, replica, ok && replica != ""
}

// LeaseKey is the lease bucket key of one partition of an ordered
// subscription; its value is the owning replica's id.
func LeaseKey(subscription string, partition int) string {
	return "lease." + subscription + "." + strconv.Itoa(partition)
}

// LeaseFilter matches every LeaseKey.
const LeaseFilter = "lease.>"

// SubscriptionLeaseFilter matches the LeaseKeys of one subscription's
// partitions.
func SubscriptionLeaseFilter(subscription string) string { return "lease." + subscription + ".*" }

// ParseLeaseKey reverses LeaseKey.
func ParseLeaseKey(key string) (subscription string, partition int, ok bool) {
	rest, ok := strings.CutPrefix(key, "lease.")
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(rest[i+1:])
	if err != nil {
		return "", 0, false
	}
	return rest[:i], p, true
}

// ParkedKey is the park bucket key of a parked stream of subscription:
// "<subscription>.<hex of the stream key>" (StreamKey of its subjects on
// the events stream; hex because escaped tokens hold '%', which keys do
// not allow).
func ParkedKey(subscription, streamKey string) string {
	return subscription + "." + hex.EncodeToString([]byte(streamKey))
}

// AttemptsKey is the park bucket key counting the failed POSTs of one
// event (id eventID) of an ordered subscription, across owners:
// "attempts.<subscription>.<hex of the event id>" (three tokens, so
// ParkedFilter of a subscription never matches it).
func AttemptsKey(subscription, eventID string) string {
	return AttemptsKeyPrefix + subscription + "." + hex.EncodeToString([]byte(eventID))
}

// AttemptsKeyPrefix starts every AttemptsKey: listings of the park bucket
// skip these keys.
const AttemptsKeyPrefix = "attempts."

// ParkedFilter matches the parked streams of subscription, or of all
// subscriptions when it is empty.
func ParkedFilter(subscription string) string {
	if subscription == "" {
		return ">"
	}
	return subscription + ".*"
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
