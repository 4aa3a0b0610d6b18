// Package legacy reads the layout the durables engine (deleted at stage 8
// of docs/design/next-engine.md) left on the server, through the
// JetStream API alone: its names, keys and records (names.go), the
// subscriptions it holds (Discover), the partitioned copy's sequences
// translated to the events stream's (CopySeqs), the park bucket's
// entries (park.go), and what a stopped consumer took and holds pending
// (taken.go). Nothing writes this layout any more: it is the contract of
// a release that is gone, spelled here alone, for `consumer migrate` (the
// plan in package migrate, the deletion in package cleanup) and the
// fixture that builds it for tests (migratetest). The skipped-version
// records (wire.SkippedKey) and the lease epoch counter (wire.EpochKey)
// keep their keys in the positions bucket, so they are wire's; the lease
// bucket (wire.DefaultLeaseBucket) is the shared engine's too.
package legacy

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

const (
	// ParkBucket is the old engine's park bucket (no TTL): park entries
	// (ParkedKey), delivered records (DeliveredKey), aside records
	// (AsideKey), failed-attempt counts (AttemptsKey), skipped-version
	// records and the lease epoch counter.
	ParkBucket = "jsbridge_parked"
	// DurableDescription begins the description of the durable consumer
	// the old engine made on the events stream for each unordered
	// subscription (named after it), followed by its endpoint: Discover
	// and the cleanup find the old durables by it.
	DurableDescription = "jsbridge webhook subscription to "

	// DeliveredKeyPrefix starts every DeliveredKey.
	DeliveredKeyPrefix = "delivered."
	// AsideKeyPrefix starts every AsideKey.
	AsideKeyPrefix = "aside."
	// AttemptsToken starts the failed-attempt counts' keys (AttemptsKey)
	// in the park bucket: a key's first token, not the attempts stream's
	// subject prefix (wire.DefaultAttemptsPrefix), whose word it shares.
	AttemptsToken = "attempts"

	copySuffix = "_ORDERED"
	copyToken  = "ordered"
)

// CopyStream is the name of the partitioned copy of the events stream
// events that ordered subscriptions read: "<events>_ORDERED".
func CopyStream(events string) string { return events + copySuffix }

// CopySource is the copy's one source as the old engine configured it:
// the events stream events, every "<eventsPrefix>.<category>.<stream>.<name>"
// transformed to "ordered.<eventsPrefix>.<partition>.<category>.<stream>.<name>",
// the partition computed by nats-server's {{partition(partitions,2)}}
// (wire.Partition reproduces it). The plan refuses a copy whose source
// differs (another partition count).
func CopySource(events, eventsPrefix string, partitions int) *jetstream.StreamSource {
	return &jetstream.StreamSource{Name: events, SubjectTransforms: []jetstream.SubjectTransformConfig{{
		Source:      eventsPrefix + ".*.*.*",
		Destination: fmt.Sprintf("%s.{{partition(%d,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}", copyPrefix(eventsPrefix), partitions),
	}}}
}

// PartitionFilter is the filter subject of partition p's consumer of an
// ordered subscription taking every event: "ordered.<eventsPrefix>.<p>.>".
func PartitionFilter(eventsPrefix string, p int) string {
	return copyPrefix(eventsPrefix) + "." + strconv.Itoa(p) + ".>"
}

// PartitionDurable is the name of partition p's durable consumer of an
// ordered subscription on the copy: "<subscription>_p<p>".
func PartitionDurable(subscription string, p int) string {
	return subscription + "_p" + strconv.Itoa(p)
}

// DeliveredKey is the park bucket key of partition p's delivered record
// of an ordered subscription: "delivered.<subscription>.<p>".
func DeliveredKey(subscription string, p int) string {
	return DeliveredKeyPrefix + subscription + "." + strconv.Itoa(p)
}

// DeliveredRecord is the value of a DeliveredKey, as JSON: per stream,
// the copy sequence of its last event the partition's owners settled
// (answered 2xx, or dead-lettered) above the partition consumer's ack
// floor. The old engine wrote it before it acked those events.
type DeliveredRecord struct {
	// Copy is the copy's creation time (Unix nanoseconds): a record of
	// another copy (deleted and made again) is not read.
	Copy int64 `json:"copy"`
	// Streams maps a stream key of the copy (wire.StreamKey of its
	// subjects there) to a copy sequence.
	Streams map[string]uint64 `json:"streams,omitempty"`
}

// AsideKey is the park bucket key of a stream an ordered subscription
// set aside on partition p: "aside.<subscription>.<p>.<hex of
// copyStreamKey>", copyStreamKey being wire.StreamKey of the stream's
// subjects in the copy.
func AsideKey(subscription string, p int, copyStreamKey string) string {
	return AsideKeyPrefix + subscription + "." + strconv.Itoa(p) + "." + hex.EncodeToString([]byte(copyStreamKey))
}

// AsideRecord is the value of an AsideKey, as JSON: the stream's head
// was refused while its later events piled up, so those were acked out
// of the partition consumer, to be read again. Sequences are the copy's.
type AsideRecord struct {
	// Subject is a subject of the stream in the copy.
	Subject string `json:"subject"`
	// Start is the first event set aside.
	Start uint64 `json:"start"`
	// Head is the stream's refused head in its lane (0: none), From the
	// sequence the stream is read again from (every event of it before
	// was settled).
	Head uint64 `json:"head,omitempty"`
	From uint64 `json:"from"`
	// Parked is true when the stream was set aside because it is parked.
	Parked bool `json:"parked,omitempty"`
}

// ParkedKey is the park bucket key of a parked stream of an ordered
// subscription: "<subscription>.<hex of streamKey>", streamKey being
// wire.StreamKey of its subjects on the events stream.
func ParkedKey(subscription, streamKey string) string {
	return subscription + "." + hex.EncodeToString([]byte(streamKey))
}

// ParkEntry is the value of a ParkedKey, as JSON, as far as the
// migration reads it: the stream is parked behind its dead-lettered
// head.
type ParkEntry struct {
	// Subscription is the ordered subscription's name.
	Subscription string `json:"subscription"`
	// Stream is the stream's name, Subject its head's subject on the
	// events stream.
	Stream  string `json:"stream"`
	Subject string `json:"subject"`
	// HeadEventID is the dead-lettered head's event id.
	HeadEventID string `json:"head_event_id"`
	// Partition is the stream's partition.
	Partition int `json:"partition"`
	// OrderStuck is true when the receiver's order gate refused the head
	// for too long (the "order-stuck" state), not a permanent failure.
	OrderStuck bool `json:"order_stuck,omitempty"`
}

// AttemptsKey is the park bucket key counting the failed POSTs (base
// 10) of one event of an ordered subscription, across owners:
// "attempts.<subscription>.<hex of eventID>".
func AttemptsKey(subscription, eventID string) string {
	return AttemptsToken + "." + subscription + "." + hex.EncodeToString([]byte(eventID))
}

// LeaseKey is the old engine's lease key of partition p of an ordered
// subscription in the lease bucket: "lease.<subscription>.<p>" (the
// shared engine's have two tokens).
func LeaseKey(subscription string, p int) string {
	return "lease." + subscription + "." + strconv.Itoa(p)
}

// MemberKey is the old engine's heartbeat of a replica running an
// ordered subscription in the lease bucket: "member.<subscription>.<replica>"
// (the shared engine's have two tokens).
func MemberKey(subscription, replica string) string {
	return "member." + subscription + "." + replica
}

// OldLeaseKey reports whether k is one of the old engine's keys of the
// lease bucket (LeaseKey or MemberKey: three tokens), and whether it is a
// heartbeat; the shared engine's keys (two tokens) are not.
func OldLeaseKey(k string) (old, heartbeat bool) {
	parts := strings.Split(k, ".")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return false, false
	}
	switch parts[0] {
	case "lease":
		_, err := strconv.Atoi(parts[2])
		return err == nil, false
	case "member":
		return true, true
	}
	return false, false
}

// copyPrefix is the copy's subject prefix: "ordered.<eventsPrefix>".
func copyPrefix(eventsPrefix string) string { return copyToken + "." + eventsPrefix }

// EventsPrefix is the subject prefix of the events stream cfg, as the
// old engine read it for the copy's transform: the prefix of its one
// "<prefix>.>" subject, else wire.DefaultEventsPrefix.
func EventsPrefix(cfg jetstream.StreamConfig) string {
	if len(cfg.Subjects) == 1 && strings.HasSuffix(cfg.Subjects[0], ".>") {
		return strings.TrimSuffix(cfg.Subjects[0], ".>")
	}
	return wire.DefaultEventsPrefix
}

// ParsePartitionDurable reverses PartitionDurable: ok is false for a
// name of another shape.
func ParsePartitionDurable(durable string) (subscription string, p int, ok bool) {
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

// EventsSubject is the events stream's subject of a message of the copy:
// "ordered.<eventsPrefix>.<p>.<rest>" becomes "<eventsPrefix>.<rest>"; a
// subject not under the copy's prefix is returned as it is.
func EventsSubject(eventsPrefix, copySubject string) string {
	rest, ok := strings.CutPrefix(copySubject, copyPrefix(eventsPrefix)+".")
	if !ok {
		return copySubject
	}
	if _, after, ok := strings.Cut(rest, "."); ok {
		return eventsPrefix + "." + after
	}
	return copySubject
}

// OldParkKey reports whether k is one of the park bucket's keys of
// subscription sub: its park entries (ParkedKey, two tokens), and its
// skipped versions, failed-attempt counts, delivered records and aside
// records (a prefix, the subscription, then one or two tokens).
func OldParkKey(k, sub string) bool {
	if rest, ok := strings.CutPrefix(k, sub+"."); ok && !strings.Contains(rest, ".") {
		return true
	}
	for _, prefix := range []string{wire.SkippedKeyPrefix, AttemptsToken + ".", DeliveredKeyPrefix, AsideKeyPrefix} {
		if rest, ok := strings.CutPrefix(k, prefix+sub+"."); ok && rest != "" {
			return true
		}
	}
	return false
}
