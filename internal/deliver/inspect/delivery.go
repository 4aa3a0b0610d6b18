package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
	"github.com/jsbridge/jsbridge/wire"
)

// Where an event stands for one subscription (Delivery.State), as its
// durable consumer says.
const (
	// DeliverySettled: acked or terminated, so answered 2xx or
	// dead-lettered (the trace's dead letters tell which); or, at or below
	// the ack floor of a durable whose start came after the event, never
	// to be delivered (Delivery.Why names the start then).
	DeliverySettled = "settled"
	// DeliveryOutstanding: delivered to the consumer and above its ack
	// floor while acks are pending: in flight, waiting for a retry, or
	// acked out of order above the floor. JetStream does not say which.
	DeliveryOutstanding = "outstanding"
	// DeliveryPending: not delivered to the consumer yet (beyond the
	// last sequence it delivered, or, for an ordered subscription, not in
	// the partitioned copy).
	DeliveryPending = "pending"
)

// Delivery is where the event stands for one subscription whose filter
// matches it, read from the subscription's durable consumer (its ack
// floor, last delivered sequence and acks pending) and, for an ordered
// subscription, its partition's delivered record; or, under the shared
// engine, for one subscription its partition's record names, read from
// the positions bucket (Key is then set). It is what `consumer trace`
// knows of an event with no attempt record: under
// attemptlog.ModeFailures a success on the first attempt leaves none.
type Delivery struct {
	// Subscription is the subscription's name.
	Subscription string `json:"subscription"`
	// Ordered says it reads the partitioned copy: Durable is its
	// partition's durable consumer there, Partition that partition and
	// Sequence the event's sequence in the copy (0 when the copy does not
	// hold it). Else Durable is on the events stream and Sequence is the
	// event's there.
	Ordered   bool   `json:"ordered"`
	Partition int    `json:"partition,omitempty"`
	Durable   string `json:"durable"`
	Sequence  uint64 `json:"sequence"`
	// Key, under the shared engine, is the positions bucket key State was
	// read from: the partition's record (pos.p<N>, Partition N), or the
	// subscription's cursor key there (cur.<subscription>.p<N>) while it
	// is not live; Durable is "" and Sequence the event's on the events
	// stream then. The bucket holds no filters: a settled State may be
	// an event the subscription does not take. "" from a durable.
	Key string `json:"key,omitempty"`
	// State is DeliverySettled, DeliveryOutstanding or DeliveryPending.
	State string `json:"state"`
	// Why says what State was read from, e.g. "at or below the ack floor
	// (1041)".
	Why string `json:"why"`
}

// deliveries reads where the event m stands for every subscription whose
// durable consumer's filter matches it: the unordered ones on cfg.Stream
// (found by their description), the ordered ones on its partitioned copy
// (by their names); then for every subscription of the shared engine
// that the positions bucket names on the event's partition
// (sharedDeliveries). A missing copy holds no ordered subscription, a
// missing bucket no subscription of the shared engine.
func deliveries(ctx context.Context, js jetstream.JetStream, cfg TraceConfig, m EventMessage) ([]Delivery, error) {
	var out []Delivery
	s, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: JetStream stream %q: %w", cfg.Stream, err)
	}
	infos, err := consumerInfos(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, ci := range infos {
		if !strings.HasPrefix(ci.Config.Description, unordered.Description) || !filterMatches(ci.Config, m.Subject) {
			continue
		}
		d := Delivery{Subscription: ci.Name, Durable: ci.Name, Sequence: m.Sequence}
		d.State, d.Why = stateAt(m.Sequence, ci.AckFloor.Stream, ci.Delivered.Stream, ci.NumAckPending, startNote(ci.Config))
		out = append(out, d)
	}
	ordered, err := orderedDeliveries(ctx, js, cfg, m)
	if err != nil {
		return nil, err
	}
	out = append(out, ordered...)
	positions, err := sharedDeliveries(ctx, js, cfg.Prefix, s.CachedInfo().Created.UnixNano(), m)
	if err != nil {
		return nil, err
	}
	out = append(out, positions...)
	slices.SortFunc(out, func(a, b Delivery) int { return strings.Compare(a.Subscription, b.Subscription) })
	return out, nil
}

// orderedDeliveries is deliveries for the ordered subscriptions: the
// event's partition is fnv32a of its stream token modulo the partitions
// (one durable each, <subscription>_p<N>); its copy is found by its
// source sequence, read from the event's publish time on; a sequence
// above the partition's ack floor with acks pending is settled when the
// partition's delivered record covers it.
func orderedDeliveries(ctx context.Context, js jetstream.JetStream, cfg TraceConfig, m EventMessage) ([]Delivery, error) {
	copyName := wire.OrderedStream(cfg.Stream)
	cp, err := js.Stream(ctx, copyName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: JetStream stream %q: %w", copyName, err)
	}
	stream, _, err := wire.ParseSubject(cfg.Prefix, m.Subject)
	if err != nil {
		return nil, nil // not a subject the copy holds
	}
	rest := strings.TrimPrefix(m.Subject, cfg.Prefix+".")
	infos, err := consumerInfos(ctx, cp)
	if err != nil {
		return nil, err
	}
	// The copy's transform says how many partitions there are; else
	// every partition has its durable: the highest + 1.
	n := copyPartitions(cp.CachedInfo().Config)
	partitions := map[string]int{}
	for _, ci := range infos {
		if sub, p, ok := wire.ParsePartitionDurable(ci.Name); ok {
			partitions[sub] = max(partitions[sub], p+1)
			if n > 0 {
				partitions[sub] = n
			}
		}
	}
	var out []Delivery
	copies := map[string]uint64{} // copy subject → the event's sequence there (0: not found)
	for _, ci := range infos {
		sub, p, ok := wire.ParsePartitionDurable(ci.Name)
		if !ok || p != wire.StreamPartition(stream, partitions[sub]) {
			continue
		}
		subject := wire.OrderedPrefix(cfg.Prefix) + "." + strconv.Itoa(p) + "." + rest
		if !filterMatches(ci.Config, subject) {
			continue
		}
		seq, seen := copies[subject]
		if !seen {
			if seq, err = copySequence(ctx, cp, subject, m); err != nil {
				return nil, err
			}
			copies[subject] = seq
		}
		d := Delivery{Subscription: sub, Ordered: true, Partition: p, Durable: ci.Name, Sequence: seq}
		if seq == 0 {
			d.State, d.Why = DeliveryPending, fmt.Sprintf("not in the partitioned copy %s (not copied yet, or gone from it)", copyName)
			out = append(out, d)
			continue
		}
		d.State, d.Why = stateAt(seq, ci.AckFloor.Stream, ci.Delivered.Stream, ci.NumAckPending, startNote(ci.Config))
		if d.State == DeliveryOutstanding {
			rec, err := readDelivered(ctx, js, sub, p)
			if err != nil {
				return nil, err
			}
			if rec != nil && rec.Copy == cp.CachedInfo().Created.UnixNano() && seq <= rec.Streams[wire.StreamKey(subject)] {
				d.State, d.Why = DeliverySettled, fmt.Sprintf("in partition %d's delivered record (written by %s), above the ack floor (%d)", p, rec.Owner, ci.AckFloor.Stream)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// copyPartitions is the partition count of the copy's subject transform
// ("{{partition(N,2)}}", wire.OrderedTransform), 0 when it has none.
func copyPartitions(cfg jetstream.StreamConfig) int {
	for _, src := range cfg.Sources {
		for _, tr := range src.SubjectTransforms {
			if m := partitionFn.FindStringSubmatch(tr.Destination); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		}
	}
	return 0
}

// partitionFn finds the partition count in a subject transform's
// destination.
var partitionFn = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// stateAt is where the message at seq stands for a durable consumer
// with ack floor floor, last delivered sequence delivered and ackPending
// acks pending; start is said of a settled state that may be the
// consumer's start ("" when it starts with the stream). A pure function.
func stateAt(seq, floor, delivered uint64, ackPending int, start string) (state, why string) {
	switch {
	case seq <= floor:
		return DeliverySettled, fmt.Sprintf("at or below the ack floor (%d)%s", floor, start)
	case seq > delivered:
		return DeliveryPending, fmt.Sprintf("not delivered yet (the consumer delivered up to %d)", delivered)
	case ackPending == 0:
		return DeliverySettled, fmt.Sprintf("delivered (up to %d) with no ack pending", delivered)
	}
	return DeliveryOutstanding, fmt.Sprintf("delivered, above the ack floor (%d) with %d acks pending: in flight, waiting for a retry, or acked out of order", floor, ackPending)
}

// startNote is what stateAt adds to a settled state when the durable
// consumer did not start with the stream's first message.
func startNote(cfg jetstream.ConsumerConfig) string {
	if cfg.DeliverPolicy == jetstream.DeliverAllPolicy {
		return ""
	}
	return ", or before the subscription's start (" + subscription.ReportedStart(cfg) + ")"
}

// filterMatches reports whether a durable consumer with cfg's filters
// takes subject (no filter: all).
func filterMatches(cfg jetstream.ConsumerConfig, subject string) bool {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		return true
	}
	for _, f := range filters {
		if _, ok := wire.IntersectFilters(f, subject); ok {
			return true
		}
	}
	return false
}

// copySequence returns the sequence in the partitioned copy cp of the
// event m, on subject there, 0 when the copy does not hold it. The copy's
// last message on subject says whether it was copied yet (sourced from
// m's sequence or a later one); if so, its messages on subject from
// shortly before m's publish time on (the copy stores a message after the
// events stream did; copySkew allows for servers' clocks) are read until
// one was sourced from m's sequence (its Nats-Stream-Source header).
func copySequence(ctx context.Context, cp jetstream.Stream, subject string, m EventMessage) (uint64, error) {
	name := cp.CachedInfo().Config.Name
	last, err := cp.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inspect: trace: last message of JetStream stream %q on %s: %w", name, subject, err)
	}
	switch src := wire.SourceSequence(last.Header.Get(wire.HeaderSourceInfo)); {
	case src == m.Sequence:
		return last.Sequence, nil
	case src < m.Sequence:
		return 0, nil // not copied yet
	}
	from := m.PublishedAt.Add(-copySkew)
	oc, err := cp.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
	})
	if err != nil {
		return 0, fmt.Errorf("inspect: trace: read JetStream stream %q (%s): %w", name, subject, err)
	}
	for {
		// The last message on subject is at or after the start: a
		// message comes until it, unless it was removed meanwhile.
		msg, err := oc.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return 0, fmt.Errorf("inspect: trace: read JetStream stream %q (%s): %w", name, subject, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return 0, fmt.Errorf("inspect: trace: read JetStream stream %q (%s): %w", name, subject, err)
		}
		switch src := wire.SourceSequence(msg.Headers().Get(wire.HeaderSourceInfo)); {
		case src == m.Sequence:
			return md.Sequence.Stream, nil
		case src > m.Sequence || md.NumPending == 0 || md.Sequence.Stream >= last.Sequence:
			return 0, nil // gone from the copy (its limits)
		}
	}
}

// copySkew is how much earlier than the event's time on the events
// stream copySequence starts reading the copy: servers' clocks may differ
// by that much.
const copySkew = 10 * time.Second

// readDelivered reads partition p's delivered record of subscription
// sub from the park bucket; nil when there is none (no bucket, no key, a
// value that does not parse).
func readDelivered(ctx context.Context, js jetstream.JetStream, sub string, p int) (*wire.DeliveredRecord, error) {
	kv, err := js.KeyValue(ctx, wire.DefaultParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: park bucket %q: %w", wire.DefaultParkBucket, err)
	}
	e, err := kv.Get(ctx, wire.DeliveredKey(sub, p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: trace: read %q of bucket %q: %w", wire.DeliveredKey(sub, p), wire.DefaultParkBucket, err)
	}
	var rec wire.DeliveredRecord
	if json.Unmarshal(e.Value(), &rec) != nil {
		return nil, nil
	}
	return &rec, nil
}

// consumerInfos lists the consumers of s.
func consumerInfos(ctx context.Context, s jetstream.Stream) ([]*jetstream.ConsumerInfo, error) {
	l := s.ListConsumers(ctx)
	var out []*jetstream.ConsumerInfo
	for ci := range l.Info() {
		out = append(out, ci)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("inspect: trace: list the consumers of JetStream stream %q: %w", s.CachedInfo().Config.Name, err)
	}
	return out, nil
}
