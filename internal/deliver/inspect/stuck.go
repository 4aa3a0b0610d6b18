package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/wire"
)

// The states of StuckStream.State.
const (
	// StateOrderStuck: the receiver's order gate refused the head (gap,
	// in-progress) for longer than the consumer's OrderStuckAfter; the
	// head was dead-lettered and the stream parked.
	StateOrderStuck = "order-stuck"
	// StateParked: the head was dead-lettered (a permanent failure, the
	// last attempt) and the stream parked (on_dead_letter: park).
	StateParked = "parked"
	// StateSetAside: the head is retried in place (a 5xx, a timeout, an
	// order gate's gap) while the stream's later events are acked out,
	// to be read again from the partitioned copy once it goes.
	StateSetAside = "set-aside"
)

// StuckStream is a stream of an ordered subscription that does not go on
// by itself, or has not for a while: parked (its head dead-lettered,
// order-stuck or not) or set aside (its head refused in place). One
// row of `consumer status`'s stuck streams.
type StuckStream struct {
	Subscription string `json:"subscription"`
	Partition    int    `json:"partition"`
	// State is StateOrderStuck, StateParked or StateSetAside.
	State string `json:"state"`
	// Stream is the source stream's name (parked streams); StreamKey the
	// stream's subject without its event name: on the events stream for
	// a parked stream, on the partitioned copy for one set aside.
	Stream    string `json:"stream,omitempty"`
	StreamKey string `json:"stream_key"`
	// HeadEventID and HeadVersion name the head: dead-lettered (parked)
	// or refused in place (set aside); empty when not known (a record
	// written before they were kept).
	HeadEventID string `json:"head_event_id,omitempty"`
	HeadVersion string `json:"head_version,omitempty"`
	// Since is when the head was parked, or the stream set aside.
	Since time.Time `json:"since"`
	// LastAnswer is the receiver's answer that stuck it: the dead
	// letter's reason (parked), or the last answer to the head when it
	// was set aside.
	LastAnswer string `json:"last_answer,omitempty"`
	// Next is the one command out of the state, or what ends it.
	Next string `json:"next"`
}

// asideRecord is the record of a stream set aside (wire.AsideKey), as
// the engine writes it.
type asideRecord = wire.AsideRecord

// stuckOf returns the stuck streams the park entries and the aside
// records in the park bucket on js name, by subscription, partition and
// stream key. A stream set aside because it is parked, or whose refused
// head was dead-lettered and parked since, is listed once, as parked.
func stuckOf(ctx context.Context, js jetstream.JetStream, parked []deadletter.ParkedStream) ([]StuckStream, error) {
	var out []StuckStream
	heads := map[string]bool{} // parked heads, by subscription and event id
	for _, ps := range parked {
		heads[ps.Subscription+"\x00"+ps.HeadEventID] = true
		s := StuckStream{
			Subscription: ps.Subscription, Partition: ps.Partition, State: StateParked, Stream: ps.Stream,
			StreamKey: wire.StreamKey(ps.Subject), HeadEventID: ps.HeadEventID, HeadVersion: ps.HeadVersion,
			Since: ps.ParkedAt, LastAnswer: ps.Reason,
		}
		if ps.OrderStuck {
			s.State = StateOrderStuck
		}
		s.Next = "consumer dlq list -s " + ps.Subscription + " names the head's seq N (event " + ps.HeadEventID +
			"); then consumer dlq replay --seq N once the receiver can take it, or consumer dlq skip --seq N to go on without it"
		out = append(out, s)
	}
	kv, err := js.KeyValue(ctx, wire.DefaultParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: park bucket %q: %w", wire.DefaultParkBucket, err)
	}
	l, err := kv.ListKeysFiltered(ctx, wire.AsideKeyPrefix+">")
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, fmt.Errorf("inspect: list streams set aside: %w", err)
	}
	var keys []string
	if l != nil {
		for k := range l.Keys() {
			keys = append(keys, k)
		}
		_ = l.Stop()
	}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // live again meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("inspect: read stream set aside %q: %w", k, err)
		}
		var rec asideRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Parked || rec.Subject == "" {
			continue
		}
		if rec.HeadEventID != "" && heads[rec.Subscription+"\x00"+rec.HeadEventID] {
			continue // its refused head was dead-lettered since: listed as parked
		}
		out = append(out, StuckStream{
			Subscription: rec.Subscription, Partition: rec.Partition, State: StateSetAside, StreamKey: wire.StreamKey(rec.Subject),
			HeadEventID: rec.HeadEventID, HeadVersion: rec.HeadVersion, Since: rec.At, LastAnswer: rec.Answer,
			Next: "none needed while the head is retried: it goes on once the receiver takes it; past --order-stuck-after of gap answers, or the last attempt, it is dead-lettered and parked (consumer trace " + rec.HeadEventID + ")",
		})
	}
	slices.SortFunc(out, func(a, b StuckStream) int {
		if c := strings.Compare(a.Subscription, b.Subscription); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return strings.Compare(a.StreamKey, b.StreamKey)
	})
	return out, nil
}
