package migrate

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// The old layout's contract: the names, keys and records the durables
// engine (deleted at stage 8 of docs/design/next-engine.md) left on the
// server, as far as the migration reads them. Nothing writes them any
// more; they are spelled here alone, and migratetest builds the old
// layout from them. The skipped-version records (wire.SkippedKey) and
// the lease epoch counter (wire.EpochKey) keep their keys in the
// positions bucket, so they are wire's; the lease bucket
// (wire.DefaultLeaseBucket) is the shared engine's too.

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

	copySuffix         = "_ORDERED"
	copyToken          = "ordered"
	deliveredKeyPrefix = "delivered."
	asideKeyPrefix     = "aside."
	// attemptsToken starts the failed-attempt counts' keys in the park
	// bucket: a key's first token, not the attempts stream's subject
	// prefix (wire.DefaultAttemptsPrefix), whose word it shares.
	attemptsToken = "attempts"
)

// errNotACopy says the stream named as the events stream's copy sources
// other streams.
var errNotACopy = errors.New("not the partitioned copy of the events stream")

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
	return deliveredKeyPrefix + subscription + "." + strconv.Itoa(p)
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
	return asideKeyPrefix + subscription + "." + strconv.Itoa(p) + "." + hex.EncodeToString([]byte(copyStreamKey))
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
	return attemptsToken + "." + subscription + "." + hex.EncodeToString([]byte(eventID))
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

// oldLeaseKey reports whether k is one of the old engine's keys of the
// lease bucket (LeaseKey or MemberKey), and whether it is a heartbeat.
func oldLeaseKey(k string) (old, heartbeat bool) {
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

// parsePartitionDurable reverses PartitionDurable.
func parsePartitionDurable(durable string) (subscription string, p int, ok bool) {
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

// listParked reads the park entries of subscription from the park bucket
// kv (nil: none), by key; an entry deleted meanwhile is passed over.
func listParked(ctx context.Context, kv jetstream.KeyValue, subscription string) ([]ParkEntry, error) {
	if kv == nil {
		return nil, nil
	}
	l, err := kv.ListKeysFiltered(ctx, subscription+".*")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: list the park entries of %q: %w", subscription, err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	_ = l.Stop()
	slices.Sort(keys)
	var out []ParkEntry
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: read %q of the park bucket: %w", k, err)
		}
		var pe ParkEntry
		if err := json.Unmarshal(e.Value(), &pe); err != nil {
			return nil, fmt.Errorf("migrate: the park entry %q: %w", k, err)
		}
		out = append(out, pe)
	}
	return out, nil
}

// copySourced is the events stream's sequence the copy cp of events
// sourced up to: the origin of its last message (its Nats-Stream-Source
// header); 0 when it never held one. When every message left the copy
// (aged out, or purged), it is the last one stored in the events stream
// before the copy stored its last message: an ephemeral consumer
// starting just after that time counts the rest (created and deleted
// here). It wraps errNotACopy when cp sources other streams than events.
func copySourced(ctx context.Context, js jetstream.JetStream, cp jetstream.Stream, events string) (uint64, error) {
	info := cp.CachedInfo()
	if src := info.Config.Sources; len(src) > 0 && (len(src) != 1 || src[0].Name != events) {
		return 0, fmt.Errorf("migrate: JetStream stream %q: %w %q", info.Config.Name, errNotACopy, events)
	}
	last := info.State.LastSeq
	if last == 0 {
		return 0, nil
	}
	m, err := cp.GetMsg(ctx, last)
	if err == nil {
		return wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo)), nil
	}
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("migrate: read JetStream stream %q at %d: %w", info.Config.Name, last, err)
	}
	ev, err := js.Stream(ctx, events)
	if err != nil {
		return 0, fmt.Errorf("migrate: events stream %q: %w", events, err)
	}
	st := ev.CachedInfo().State
	if st.Msgs == 0 || info.State.LastTime.IsZero() {
		return 0, nil
	}
	after := info.State.LastTime.Add(time.Nanosecond)
	c, err := js.CreateConsumer(ctx, events, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &after, AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, InactiveThreshold: time.Minute, Description: "jsbridge migrate: what an emptied copy sourced",
	})
	if err != nil {
		return 0, fmt.Errorf("migrate: count JetStream stream %q's messages after %s: %w", events, after.Format(time.RFC3339Nano), err)
	}
	pending := c.CachedInfo().NumPending
	_ = js.DeleteConsumer(ctx, events, c.CachedInfo().Name) // else gone after InactiveThreshold
	if pending >= st.LastSeq {
		return 0, nil
	}
	return st.LastSeq - pending, nil
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
