// Package deadletter is the consumer's dead letters: the JetStream
// dead-letter stream (write, list, get, count, delete, purge), the
// versions dead-lettered and not delivered since (RecordSkipped,
// ForgetSkipped), and the version chain's look-up, which steps over them
// (Predecessor). It knows nothing of deliveries beyond the Letter it is
// handed.
package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dead-letter stream defaults.
const (
	// DefaultDuplicateWindow is the DLQ stream's duplicate window: a dead
	// letter written twice (its settlement lost, the event sent again by
	// the next owner and given up on again) within it is stored once.
	DefaultDuplicateWindow = 2 * time.Minute
)

// ErrNotFound is returned by DLQ.Get when no dead letter has the
// sequence.
var ErrNotFound = errors.New("dead letter not found")

// ErrSubjects is wrapped by DLQ.Provision when the existing dead-letter
// stream does not hold the dead letters' subjects (<prefix>.>): they would
// be stored in another stream, or in none.
var ErrSubjects = errors.New("dead-letter stream does not hold the dead-letter subjects")

// Config configures a DLQ. Zero fields take their defaults.
type Config struct {
	// Stream is the JetStream stream's name. Default "DLQ".
	Stream string
	// SubjectPrefix is the first subject token. Default "dlq"; the stream
	// holds <SubjectPrefix>.>.
	SubjectPrefix string
	// Replicas is the replica count of a dead-letter stream Provision
	// creates: 1 on a standalone server, 3 on a cluster. Default 1. An
	// existing stream with another count is left as it is and a warning
	// (stream, have, want) goes to Logger.
	Replicas int
	// EventsStream, when set, is the events stream whose retention a
	// dead-letter stream Provision creates follows: MaxAge twice the
	// events stream's (retentionFactor; none when it has none), and no
	// size limit, so that a dead letter is never dropped for size (a full
	// store refuses the write instead, and the message stays unacked until
	// it can be written). Default "": no limits. An existing stream keeps
	// its own.
	EventsStream string
	// Archetype is the engine's clock (a letter's time when it has
	// none) and logger (Provision's warnings). Default base.Default.
	*base.Archetype
}

// DLQ is the JetStream-backed dead-letter stream: a Writer, and the
// list, get, delete and purge operations behind `consumer dlq`. A dead
// letter keeps the original message's data and its reader headers (ce-*,
// Content-Type), the last status and error, the attempt count and the
// times; it is stored on
// dlq.<subscription>.<original subject>, with file storage and no size
// limit (dead letters leave by replay or purge, or at twice the events
// stream's MaxAge when it has one: Config.EventsStream).
type DLQ struct {
	js       jetstream.JetStream
	events   string // the events stream whose MaxAge a created stream follows
	stream   string
	prefix   string
	replicas int
	arch     *base.Archetype // the clock (a letter's time) and logger
}

// New returns a DLQ on js. It does not touch the server: call Provision
// before the first DeadLetter.
func New(js jetstream.JetStream, cfg Config) *DLQ {
	return &DLQ{js: js, events: cfg.EventsStream, stream: cmp.Or(cfg.Stream, wire.DefaultDLQStream),
		prefix: cmp.Or(cfg.SubjectPrefix, wire.DefaultDLQPrefix), replicas: max(cfg.Replicas, 1), arch: base.Default(cfg.Archetype)}
}

// Stream returns the dead-letter stream's name.
func (q *DLQ) Stream() string { return q.stream }

// Provision creates the dead-letter stream when it is missing (file
// storage, subjects <prefix>.>, duplicate window
// DefaultDuplicateWindow, Config.Replicas, MaxAge following
// Config.EventsStream's) and leaves an existing one
// unchanged, warning when its replica count is not Config.Replicas. It
// fails with ErrSubjects when the existing stream does not have
// <prefix>.> (or ">") among its subjects, and with JetStream's error
// (wrapped) otherwise, e.g. when another stream already holds those
// subjects, or replicas > 1 on a standalone server (API error 10074).
func (q *DLQ) Provision(ctx context.Context) error {
	s, err := q.js.Stream(ctx, q.stream)
	if err == nil {
		cfg := s.CachedInfo().Config
		if cfg.Replicas != q.replicas {
			q.arch.Logger.Warn(fmt.Sprintf("JetStream stream %s has %d replica(s), not the %d asked for; it is left as it is: change it with: nats stream edit %s --replicas %d",
				q.stream, cfg.Replicas, q.replicas, q.stream, q.replicas), "jetstream_stream", q.stream, "have", cfg.Replicas, "want", q.replicas)
		}
		return q.checkSubjects(cfg.Subjects)
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	maxAge, err := q.maxAge(ctx)
	if err != nil {
		return err
	}
	_, err = q.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        q.stream,
		Description: "jsbridge dead letters: deliveries given up on, per subscription",
		Subjects:    []string{wire.All(q.prefix)},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      maxAge,
		Duplicates:  dupWindow(maxAge),
		Replicas:    q.replicas,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("deadletter: create dead-letter stream %q (subjects %s.>): %w", q.stream, q.prefix, err)
	}
	return nil
}

// retentionFactor is how many times the events stream's MaxAge a new
// dead-letter stream keeps its dead letters (Config.EventsStream): a dead
// letter outlives its original by as long again.
const retentionFactor = 2

// maxAge is the MaxAge of a dead-letter stream Provision creates:
// retentionFactor times the events stream's, 0 (none) when it has none,
// does not exist yet, or Config.EventsStream is empty.
func (q *DLQ) maxAge(ctx context.Context) (time.Duration, error) {
	if q.events == "" {
		return 0, nil
	}
	s, err := q.js.Stream(ctx, q.events)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("deadletter: events stream %q (its MaxAge sets the dead letters'): %w", q.events, err)
	}
	return max(retentionFactor*s.CachedInfo().Config.MaxAge, 0), nil
}

// dupWindow is the duplicate window of a dead-letter stream with maxAge:
// DefaultDuplicateWindow, or maxAge when shorter (JetStream refuses a
// window longer than MaxAge).
func dupWindow(maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < DefaultDuplicateWindow {
		return maxAge
	}
	return DefaultDuplicateWindow
}

// checkSubjects fails with ErrSubjects unless subjects hold the dead
// letters' (<prefix>.> or >).
func (q *DLQ) checkSubjects(subjects []string) error {
	if slices.Contains(subjects, ">") || slices.Contains(subjects, wire.All(q.prefix)) {
		return nil
	}
	return fmt.Errorf("deadletter: %w: JetStream stream %q has subjects %q, not %q", ErrSubjects, q.stream, subjects, wire.All(q.prefix))
}

// readerHeader reports whether a header of the original message is copied
// onto its dead letter: the CloudEvents attributes (ce-*) and Content-Type,
// which describe the event to whoever lists or replays it. No other header
// is, above all no Nats-* header: JetStream reads those on the dead
// letter's own publish as instructions. The bridge's fence
// (Nats-Expected-Last-Subject-Sequence and its -Subject) and the other
// preconditions (Nats-Expected-Stream, -Last-Sequence, -Last-Msg-Id) would
// make the DLQ refuse it ("wrong last sequence"), Nats-Batch-* would make
// it part of a batch, Nats-TTL would expire it and Nats-Rollup would purge
// its subject; Nats-Msg-Id is replaced by the dead letter's own.
func readerHeader(name string) bool {
	return wire.IsCEHeader(name) || strings.EqualFold(name, wire.HeaderContentType)
}

// filter is the subject filter of one subscription's dead letters, or of
// all when subscription is empty.
func (q *DLQ) filter(subscription string) string {
	return wire.DLQFilter(q.prefix, subscription)
}

// DeadLetter stores dl on dlq.<subscription>.<original subject> and waits
// for the stream's ack. It implements Writer. The dead letter carries
// the original's reader headers only (see readerHeader), the ordering
// headers of the failed attempt (Jsbridge-Previous-Version,
// Jsbridge-Partition, Jsbridge-Lease-Epoch: dl.Previous, dl.Partition,
// dl.Epoch, when set) and no publish precondition: whatever the original was published under, JetStream
// stores it. When no stream answers on the subject (the dead-letter stream
// was deleted) it provisions the stream again and publishes once more; when
// another stream than the dead-letter stream stored it, it fails.
func (q *DLQ) DeadLetter(ctx context.Context, dl Letter) error {
	h := nats.Header{}
	for k, vs := range dl.Event.Header {
		if readerHeader(k) {
			h[k] = append([]string(nil), vs...)
		}
	}
	if dl.Event.Seq != 0 {
		h.Set(wire.HeaderDLQStreamSeq, strconv.FormatUint(dl.Event.Seq, 10))
		h.Set(wire.HeaderDLQPublishedAt, dl.Event.Time.UTC().Format(time.RFC3339Nano))
	}
	if dl.EventID != "" {
		h.Set(wire.HeaderMsgID, wire.DLQMsgID(dl.Subscription, dl.EventID))
	}
	at := dl.At
	if at.IsZero() {
		at = q.arch.Clock.Now()
	}
	h.Set(wire.HeaderDLQSubscription, dl.Subscription)
	h.Set(wire.HeaderDLQEndpoint, dl.Endpoint)
	h.Set(wire.HeaderDLQEventID, dl.EventID)
	h.Set(wire.HeaderDLQSubject, dl.Event.Subject)
	h.Set(wire.HeaderDLQStatus, strconv.Itoa(dl.Status))
	h.Set(wire.HeaderDLQReason, dl.Reason)
	h.Set(wire.HeaderDLQAttempts, strconv.Itoa(dl.Attempt))
	h.Set(wire.HeaderDLQLastAttemptAt, at.UTC().Format(time.RFC3339Nano))
	for k, v := range map[string]string{wire.HeaderPreviousVersion: dl.Previous, wire.HeaderPartition: dl.Partition, wire.HeaderLeaseEpoch: dl.Epoch} {
		if v != "" {
			h.Set(k, v)
		}
	}
	msg := &nats.Msg{Subject: wire.DLQSubject(q.prefix, dl.Subscription, dl.Event.Subject), Header: h, Data: dl.Event.Data}
	ack, err := q.js.PublishMsg(ctx, msg)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		if perr := q.Provision(ctx); perr == nil {
			ack, err = q.js.PublishMsg(ctx, msg)
		}
	}
	if err == nil && ack.Stream != q.stream {
		err = fmt.Errorf("stored by JetStream stream %q, not the dead-letter stream (check both streams' subjects)", ack.Stream)
	}
	if err != nil {
		return fmt.Errorf("deadletter: dead-letter event %q of subscription %q to stream %q: %w", dl.EventID, dl.Subscription, q.stream, err)
	}
	return nil
}

// Stored is one message of the dead-letter stream.
type Stored struct {
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

// ParseStored reads the dead letter stored at seq of the dead-letter
// stream at time at, with headers h and body data.
func ParseStored(seq uint64, at time.Time, h nats.Header, data []byte) Stored {
	d := Stored{
		Seq: seq, DeadLetteredAt: at, Header: h, Data: data,
		Subscription: h.Get(wire.HeaderDLQSubscription),
		Endpoint:     h.Get(wire.HeaderDLQEndpoint),
		EventID:      h.Get(wire.HeaderDLQEventID),
		Subject:      h.Get(wire.HeaderDLQSubject),
		Reason:       h.Get(wire.HeaderDLQReason),

		PreviousVersion: h.Get(wire.HeaderPreviousVersion),
		Partition:       h.Get(wire.HeaderPartition),
		LeaseEpoch:      h.Get(wire.HeaderLeaseEpoch),
	}
	d.StreamSeq, _ = strconv.ParseUint(h.Get(wire.HeaderDLQStreamSeq), 10, 64)
	d.Status, _ = strconv.Atoi(h.Get(wire.HeaderDLQStatus))
	d.Attempts, _ = strconv.Atoi(h.Get(wire.HeaderDLQAttempts))
	d.PublishedAt, _ = time.Parse(time.RFC3339Nano, h.Get(wire.HeaderDLQPublishedAt))
	d.LastAttemptAt, _ = time.Parse(time.RFC3339Nano, h.Get(wire.HeaderDLQLastAttemptAt))
	return d
}

// Count returns the number of dead letters of subscription (all when
// empty).
func (q *DLQ) Count(ctx context.Context, subscription string) (uint64, error) {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return 0, fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(q.filter(subscription)))
	if err != nil {
		return 0, fmt.Errorf("deadletter: dead-letter stream %q info: %w", q.stream, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

// List returns the dead letters of subscription (all when empty), oldest
// first.
func (q *DLQ) List(ctx context.Context, subscription string) ([]Stored, error) {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	var out []Stored
	err = jsapi.ReadAll(ctx, s, q.filter(subscription), func(md *jetstream.MsgMetadata, m jetstream.Msg) bool {
		out = append(out, ParseStored(md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data()))
		return true
	})
	if err != nil {
		return out, fmt.Errorf("deadletter: read dead-letter stream %q: %w", q.stream, err)
	}
	return out, nil
}

// Get returns the dead letter at seq, or an error wrapping
// ErrNotFound.
func (q *DLQ) Get(ctx context.Context, seq uint64) (Stored, error) {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return Stored{}, fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Stored{}, fmt.Errorf("deadletter: %w: seq %d in stream %q", ErrNotFound, seq, q.stream)
	}
	if err != nil {
		return Stored{}, fmt.Errorf("deadletter: get dead letter %d from stream %q: %w", seq, q.stream, err)
	}
	return ParseStored(m.Sequence, m.Time, m.Header, m.Data), nil
}

// Delete removes the dead letter at seq.
func (q *DLQ) Delete(ctx context.Context, seq uint64) error {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("deadletter: delete dead letter %d from stream %q: %w", seq, q.stream, err)
	}
	return nil
}

// Purge removes every dead letter of subscription (all when empty) and
// returns how many it removed.
func (q *DLQ) Purge(ctx context.Context, subscription string) (uint64, error) {
	n, err := q.Count(ctx, subscription)
	if err != nil || n == 0 {
		return 0, err
	}
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return 0, fmt.Errorf("deadletter: dead-letter stream %q: %w", q.stream, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(q.filter(subscription))); err != nil {
		return 0, fmt.Errorf("deadletter: purge %s from stream %q: %w", q.filter(subscription), q.stream, err)
	}
	return n, nil
}
