package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// ParkedStream is a parked stream of an ordered subscription, as stored in
// the park bucket.
type ParkedStream struct {
	// Subscription is the ordered subscription's name.
	Subscription string `json:"subscription"`
	// Stream is the source stream's name.
	Stream string `json:"stream"`
	// Subject is the dead-lettered head's subject on the events stream
	// (the dead letter's Subject).
	Subject string `json:"subject"`
	// HeadEventID is the dead-lettered head's event id.
	HeadEventID string `json:"head_event_id"`
	// HeadVersion is the dead-lettered head's version in its stream (its
	// ce-streamversion, base 10); empty when it carries none.
	HeadVersion string `json:"head_version,omitempty"`
	// Partition is the stream's partition.
	Partition int `json:"partition"`
	// ParkedAt is when the head was dead-lettered.
	ParkedAt time.Time `json:"parked_at"`
	// Held is how many later events the owning replica held in memory at
	// UpdatedAt (0 once they were set aside: acked out, to be read again
	// from the partitioned copy); OldestHeldAt when the oldest of them
	// was first held.
	Held         int       `json:"held"`
	OldestHeldAt time.Time `json:"oldest_held_at,omitzero"`
	UpdatedAt    time.Time `json:"updated_at,omitzero"`
	// Replica is the replica that reported Held.
	Replica string `json:"replica,omitempty"`
	// Reason is why the head was dead-lettered (the dead letter's reason).
	Reason string `json:"reason,omitempty"`
	// OrderStuck is true when the head was dead-lettered because the
	// receiver's order gate refused it (gap, in-progress) for longer than
	// the consumer's OrderStuckAfter (the "order-stuck" state), not for
	// a permanent failure.
	OrderStuck bool `json:"order_stuck,omitempty"`
	// Error, when set, says that held events of the stream are about to
	// leave the partitioned copy, or left it: its oldest held event
	// (AtRiskEventID, in the copy since AtRiskEventTime, so its age is now
	// minus that) reached 3/4 of the copy's MaxAge (CopyMaxAge,
	// nanoseconds in JSON), and what to do. Past CopyMaxAge the copy
	// removed it: it is delivered only while Replica holds it in memory
	// (a hand-over or a restart loses it). Empty while no held event is
	// that old.
	Error           string        `json:"error,omitempty"`
	AtRiskEventID   string        `json:"at_risk_event_id,omitempty"`
	AtRiskEventTime time.Time     `json:"at_risk_event_time,omitzero"`
	CopyMaxAge      time.Duration `json:"copy_max_age,omitempty"`
}

// ListParked returns the parked streams of subscription (all when empty)
// from the park bucket on js; none when the bucket does not exist.
func ListParked(ctx context.Context, js jetstream.JetStream, subscription string) ([]ParkedStream, error) {
	kv, err := js.KeyValue(ctx, wire.DefaultParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("deadletter: park bucket %q: %w", wire.DefaultParkBucket, err)
	}
	l, err := kv.ListKeysFiltered(ctx, wire.ParkedFilter(subscription))
	if err != nil {
		return nil, fmt.Errorf("deadletter: list park bucket %q: %w", wire.DefaultParkBucket, err)
	}
	var keys []string
	for k := range l.Keys() {
		if !strings.HasPrefix(k, wire.AttemptsKeyPrefix) && !strings.HasPrefix(k, wire.SkippedKeyPrefix) && !strings.HasPrefix(k, wire.AsideKeyPrefix) && !strings.HasPrefix(k, wire.DeliveredKeyPrefix) && k != wire.EpochKey { // failed attempts' counts, skipped versions, set-aside streams, delivered records and the epoch counter share the bucket
			keys = append(keys, k)
		}
	}
	_ = l.Stop()
	var out []ParkedStream
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("deadletter: read park entry %q: %w", k, err)
		}
		var ps ParkedStream
		if err := json.Unmarshal(e.Value(), &ps); err != nil {
			return out, fmt.Errorf("deadletter: park entry %q: %w", k, err)
		}
		out = append(out, ps)
	}
	slices.SortFunc(out, func(a, b ParkedStream) int { return a.ParkedAt.Compare(b.ParkedAt) })
	return out, nil
}

// ErrNotParked is returned (wrapped) by Unpark when no stream is parked
// behind the dead letter.
var ErrNotParked = errors.New("no stream parked behind this dead letter")

// Unpark releases the stream parked behind dl (its head): the owning
// replica delivers the held events, in order. Replay calls it after the
// head was delivered; SkipParked before deleting the head. It fails with
// ErrNotParked when the park bucket has no entry for dl's stream with dl
// as its head.
func Unpark(ctx context.Context, js jetstream.JetStream, dl Stored) error {
	kv, err := js.KeyValue(ctx, wire.DefaultParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("deadletter: dead letter %d: %w", dl.Seq, ErrNotParked)
	}
	if err != nil {
		return fmt.Errorf("deadletter: park bucket %q: %w", wire.DefaultParkBucket, err)
	}
	key := wire.ParkedKey(dl.Subscription, wire.StreamKey(dl.Subject))
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deadletter: dead letter %d: %w", dl.Seq, ErrNotParked)
	}
	if err != nil {
		return fmt.Errorf("deadletter: read park entry: %w", err)
	}
	var ps ParkedStream
	if err := json.Unmarshal(e.Value(), &ps); err != nil {
		return fmt.Errorf("deadletter: park entry %q: %w", key, err)
	}
	if ps.HeadEventID != dl.EventID {
		return fmt.Errorf("deadletter: dead letter %d (event %s): %w (its stream's head is event %s)", dl.Seq, dl.EventID, ErrNotParked, ps.HeadEventID)
	}
	if err := kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		return fmt.Errorf("deadletter: unpark stream %q: %w", ps.Stream, err)
	}
	return nil
}

// SkipParked drops the dead-lettered head dl of a parked stream: the
// stream is unparked (its held events are delivered, in order) and dl is
// deleted from q.
func SkipParked(ctx context.Context, js jetstream.JetStream, q *DLQ, dl Stored) error {
	if err := Unpark(ctx, js, dl); err != nil {
		return err
	}
	if err := q.Delete(ctx, dl.Seq); err != nil {
		return fmt.Errorf("stream unparked, but its dead letter %d stays: delete it (do not replay it: its successors went on): %w", dl.Seq, err)
	}
	return nil
}
