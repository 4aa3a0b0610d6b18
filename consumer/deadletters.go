package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
)

// Errors of the dead-letter operations; test them with errors.Is.
var (
	// ErrDeadLetterNotFound is wrapped by DeadLetters.Get when no dead
	// letter has the sequence.
	ErrDeadLetterNotFound = deadletter.ErrNotFound
	// ErrDLQSubjects is wrapped by Provision (and Start) when the existing
	// dead-letter stream does not hold the dead letters' subjects
	// (dlq.>): they would be stored in another stream, or in none.
	ErrDLQSubjects = deadletter.ErrSubjects
	// ErrNotParked is wrapped by DeadLetters.Skip and DeadLetters.Unpark
	// when no stream is parked behind the dead letter.
	ErrNotParked = errors.New("no stream parked behind this dead letter")
	// ErrUnknownSubscription is wrapped in a ReplayResult's Err when the
	// dead letter names a subscription the Consumer was not given.
	ErrUnknownSubscription = deliver.ErrUnknownSubscription
)

// DeadLetter is one message of the dead-letter stream: a delivery given
// up on, as `consumer dlq list --json` prints it (these JSON keys).
type DeadLetter struct {
	// Seq is its sequence in the dead-letter stream (what replay --seq takes).
	Seq uint64 `json:"seq"`
	// Subscription, Endpoint and EventID say whose delivery it was.
	Subscription string `json:"subscription"`
	Endpoint     string `json:"endpoint"`
	EventID      string `json:"event_id"`
	// Subject and StreamSeq locate the original on the events stream.
	Subject   string `json:"subject"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
	// Status is the last HTTP status (0: no response); Reason the last error.
	Status int    `json:"status"`
	Reason string `json:"reason"`
	// Attempts is the number of deliveries of the original message.
	Attempts int `json:"attempts"`
	// PublishedAt is when the event reached the events stream,
	// LastAttemptAt when the last attempt was made, DeadLetteredAt when the
	// dead letter was stored.
	PublishedAt    time.Time `json:"published_at,omitzero"`
	LastAttemptAt  time.Time `json:"last_attempt_at,omitzero"`
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// PreviousVersion, Partition and LeaseEpoch are the ordering headers
	// the failed attempt of an ordered subscription sent
	// (Jsbridge-Previous-Version: "none" or a version; Jsbridge-Partition,
	// Jsbridge-Lease-Epoch), "" when it sent none (an unordered
	// subscription, or a dead letter stored before the version chain).
	// A replay sends PreviousVersion again, and neither of the others.
	PreviousVersion string `json:"previous_version,omitempty"`
	Partition       string `json:"partition,omitempty"`
	LeaseEpoch      string `json:"lease_epoch,omitempty"`
	// Header holds the original's reader headers (ce-*, Content-Type),
	// the ordering headers and the Jsbridge-Dlq-* ones; Data the original
	// body, byte for byte.
	Header nats.Header `json:"-"`
	Data   []byte      `json:"-"`
}

// ParkedStream is a parked stream of an ordered subscription: a stream
// whose head was dead-lettered with DeadLetterPark; its later events wait
// in the events stream (nothing is held in memory) until the head is
// replayed, skipped or unparked.
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
	// Reason is why the head was dead-lettered (the dead letter's reason).
	Reason string `json:"reason,omitempty"`
	// OrderStuck is true when the head was dead-lettered because the
	// receiver's order gate refused it (gap, in-progress) for longer than
	// the consumer's OrderStuckAfter (the "order-stuck" state), not for
	// a permanent failure.
	OrderStuck bool `json:"order_stuck,omitempty"`
}

// ReplayResult is the outcome of replaying one dead letter.
type ReplayResult struct {
	// Letter is the dead letter replayed.
	Letter DeadLetter
	// Delivered is true when the endpoint answered 2xx and the dead letter
	// was removed from the dead-letter stream.
	Delivered bool
	// Status is the HTTP status (0 without a response).
	Status int
	// Err says why it was not delivered or not removed; nil when Delivered.
	Err error
}

// DeadLetters is the dead-letter stream and the parked streams of ordered
// subscriptions (in the positions bucket): the list, get, count, purge, skip and unpark operations
// behind `consumer dlq`. Replaying needs the subscriptions' secrets: see
// Consumer.Replay. Its methods are safe for concurrent use.
type DeadLetters struct {
	js jetstream.JetStream
	q  *deadletter.DLQ
}

// OpenDeadLetters returns the dead-letter stream named stream (default
// DefaultDLQStream when "") on js, without touching the server.
func OpenDeadLetters(js jetstream.JetStream, stream string) *DeadLetters {
	return &DeadLetters{js: js, q: deadletter.New(js, deadletter.Config{Stream: stream})}
}

// Stream returns the dead-letter stream's name.
func (d *DeadLetters) Stream() string { return d.q.Stream() }

// List returns the dead letters of subscription (all when ""), oldest
// first.
func (d *DeadLetters) List(ctx context.Context, subscription string) ([]DeadLetter, error) {
	letters, err := d.q.List(ctx, subscription)
	return fromStored(letters), err
}

// Get returns the dead letter at seq, or an error wrapping
// ErrDeadLetterNotFound.
func (d *DeadLetters) Get(ctx context.Context, seq uint64) (DeadLetter, error) {
	dl, err := d.q.Get(ctx, seq)
	return DeadLetter(dl), err
}

// Count returns how many dead letters subscription (all when "") has.
func (d *DeadLetters) Count(ctx context.Context, subscription string) (uint64, error) {
	return d.q.Count(ctx, subscription)
}

// Purge deletes every dead letter of subscription (all when "") for good
// and returns how many it deleted.
func (d *DeadLetters) Purge(ctx context.Context, subscription string) (uint64, error) {
	return d.q.Purge(ctx, subscription)
}

// Parked returns the parked streams of subscription (all when ""): the
// parked asides of the partition records in the positions bucket, each
// described by its head's dead letter, oldest first; none when the
// bucket does not exist.
// (`consumer migrate` moved the parked heads of an older release's park
// bucket into the positions bucket.)
func (d *DeadLetters) Parked(ctx context.Context, subscription string) ([]ParkedStream, error) {
	return sharedParked(ctx, d.js, d.q, subscription)
}

// Unpark releases the stream parked behind dl (its head): the owner of
// the stream's partition reads the stream's later events again, in
// order, the first naming the head's own predecessor (as after Skip; a
// later replay of dl sends it with its own chain header); dl stays in
// the dead-letter stream. The request is written to the positions
// bucket, where the owner applies it. It fails with ErrNotParked when
// no partition record holds a stream parked with dl as its head.
func (d *DeadLetters) Unpark(ctx context.Context, dl DeadLetter) error {
	return unparkShared(ctx, d.js, deadletter.Stored(dl), opUnpark)
}

// Skip drops the dead-lettered head dl of a parked stream: the stream is
// unparked as by Unpark (its next event names the head's own
// predecessor) and dl is deleted. It fails with ErrNotParked when no
// partition record holds a stream parked with dl as its head.
func (d *DeadLetters) Skip(ctx context.Context, dl DeadLetter) error {
	return skipShared(ctx, d.js, d.q, deadletter.Stored(dl))
}

// fromStored converts the engine's dead letters.
func fromStored(letters []deadletter.Stored) []DeadLetter {
	if letters == nil {
		return nil
	}
	out := make([]DeadLetter, len(letters))
	for i, dl := range letters {
		out[i] = DeadLetter(dl)
	}
	return out
}

// toStored converts dead letters to the engine's.
func toStored(letters []DeadLetter) []deadletter.Stored {
	out := make([]deadletter.Stored, len(letters))
	for i, dl := range letters {
		out[i] = deadletter.Stored(dl)
	}
	return out
}
