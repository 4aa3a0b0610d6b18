package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of Config.
const (
	// DefaultSource is the CloudEvents source attribute (ce-source).
	DefaultSource = "jsbridge"
	// DefaultMaxInFlight is how many streams are published concurrently.
	DefaultMaxInFlight = 256
	// DefaultPublishTimeout bounds one publish, from send to PubAck.
	DefaultPublishTimeout = 5 * time.Second
)

// errInvalidData is wrapped (inside a drain.NonRetryableError) in the error of
// an event whose data is not valid JSON.
var errInvalidData = errors.New("event data is not valid JSON")

// ErrTooLarge is wrapped (inside a drain.NonRetryableError) in the error of an
// event whose message exceeds the server's max payload or the JetStream
// stream's maximum message size.
var ErrTooLarge = errors.New("message too large")

// errNotAttempted is the (retryable) error of an event that was not published
// because an earlier event of the same stream failed: sending it would break
// the stream's order in JetStream.
var errNotAttempted = errors.New("not published: an earlier event of the stream failed")

// ErrConflict is the (retryable) error of an event JetStream refused because
// the last message on its stream's subjects was not the one this Forwarder
// expected (Nats-Expected-Last-Subject-Sequence): another publisher stored a
// message of the stream meanwhile, typically a bridge whose lease expired
// while it was still publishing, or a publish that sat in a client's
// reconnect buffer. Nothing was stored; the drain retries the stream and the
// retry reconciles.
var ErrConflict = errors.New("stream changed in JetStream by another publisher")

// errWrongStream is wrapped (inside a drain.NonRetryableError) in the error of
// an event handed to Handle in the batch of another stream.
var errWrongStream = errors.New("event belongs to another stream")

// errLostInJetStream is wrapped (inside a drain.NonRetryableError) in the
// error of the first event of a batch when reconciliation finds the
// stream's last message in JetStream at a version below the batch's
// watermark: events the bridge forwarded (and JetStream acknowledged) are
// gone, lost in a crash or deleted. Publishing on would turn the lost tail
// into a hole in the middle of the stream, which no re-publish can put back
// in order; the stream blocks until an operator restores the tail (`bridge
// verify --repair`) and unblocks it.
var errLostInJetStream = errors.New("forwarded events are missing from JetStream")

// Config configures a Forwarder. The zero value is usable.
type Config struct {
	// Prefix is the subject prefix (see Subject). Default "events". It must
	// be a literal subject: no wildcards, empty tokens or whitespace.
	Prefix string
	// Source is the CloudEvents source attribute (ce-source). Default
	// "jsbridge".
	Source string
	// Stream, when set, is the JetStream stream every publish must land in
	// (Nats-Expected-Stream): a publish captured by another stream fails
	// (retryable) instead of being stored there. Default "" (no check).
	Stream string
	// MaxInFlight is how many streams are published concurrently; within a
	// stream publishes are strictly sequential. Handle sends up to this
	// many streams whose position it knows at once (see Handle) while as
	// many others are published. Default 256.
	MaxInFlight int
	// PublishTimeout bounds one publish, from send to PubAck, and one
	// reconciliation lookup. Default 5 s. Under a drain, keep it within
	// 40 % of the drain's lease (bridge.FitPublishTimeout does): the
	// handler's context ends before it otherwise.
	PublishTimeout time.Duration
	// Logger receives failures (Warn), duplicates and stores (Debug) with the
	// keys stream and event_id. Default: discard.
	Logger *slog.Logger
	// Observer is told about every publish (metrics). Default: none.
	Observer Observer
	// TracerProvider makes the publish spans (see trace.go and
	// batchtrace.go: one per fast batch, one per event sent on its own).
	// Default nil: otel's global tracer provider, a no-op until the
	// application installs an SDK.
	TracerProvider trace.TracerProvider
}

// Status is what became of one event in Publish.
type Status int

const (
	// Failed: the event is not (known to be) stored; Outcome.Err says why.
	Failed Status = iota
	// Stored: JetStream stored the event as a new message.
	Stored
	// Duplicate: JetStream already had a message with this Nats-Msg-Id
	// within its duplicate window and dropped the re-publish.
	Duplicate
	// AlreadyStored: reconciliation found the event (or a later one of its
	// stream) already in JetStream, so it was not sent again. Only Handle
	// produces it, for a batch with Reconcile set or resuming past version 0.
	AlreadyStored
)

// String returns "failed", "stored", "duplicate" or "already_stored".
func (s Status) String() string {
	switch s {
	case Stored:
		return "stored"
	case Duplicate:
		return "duplicate"
	case AlreadyStored:
		return "already_stored"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Outcome is what became of one event in Publish.
type Outcome struct {
	// Status is Stored, Duplicate or Failed.
	Status Status
	// Sequence is the JetStream stream sequence of the message (for a
	// Duplicate, the sequence of the message already stored; for
	// AlreadyStored, that of the last message of the stream found by
	// reconciliation); 0 when Failed.
	Sequence uint64
	// Err is nil unless Failed. Non-retryable failures are
	// drain.NonRetryableError wrapping ErrTooLarge, errInvalidData or the
	// event's own Err (an event the store could not read); failures of the
	// bus (timeouts, a publish or lookup cut short by the context before
	// JetStream answered, no server or stream answering, a closed or
	// reconnecting connection, a JetStream API 503) are
	// drain.UnavailableError; a refused expectation wraps ErrConflict;
	// events after a failed one of the same stream get errNotAttempted.
	Err error
	// Retryable reports whether publishing the event again may succeed:
	// false for a drain.NonRetryableError, true for every other failure.
	Retryable bool
}

// Forwarder publishes events to JetStream, keeping each stream's order and
// storing each event once, also beyond the duplicate window. It is a
// drain.Handler. Safe for concurrent use, but two concurrent calls must not
// publish the same stream (the drain's lease guarantees that).
//
// It remembers, per stream it published, the JetStream sequence of the
// stream's last message (at most 100,000 streams; others are looked up
// again when needed). A publish carries that sequence as
// Nats-Expected-Last-Subject-Sequence over the stream's subjects
// (StreamFilter), so JetStream refuses (ErrConflict) a publish from a
// bridge that does not know the stream's latest message: one whose lease
// expired while it was still publishing, or a message left in a client's
// reconnect buffer.
//
// Handle sends a stream's run of new events (none of which JetStream can
// hold yet) as one fast batch when the JetStream stream allows them
// (allow_batched, nats-server 2.14+; looked up once a minute): the events
// go out back to back, only the first carries the expectation, the server
// stores nothing after a message it refused (gap: fail), and one PubAck
// answers the batch. A refused batch (batching disabled, too many in
// flight) falls back to one event at a time, each waiting for its PubAck;
// so do re-publishes, where duplicates must be told apart, and Publish.
type Forwarder struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	batcher *batcher // fast batches; see batch.go

	tracer   trace.Tracer // publish spans; see trace.go
	spanName string

	mu        sync.Mutex
	positions map[string]position // per stream, what this Forwarder last saw stored
	stream    jetstream.Stream    // for reconciliation; resolved on first use
	// Whether the JetStream stream allows fast batches (allow_batched),
	// as of batchCheckedAt; looked up again after batchRecheck.
	batchOK        bool
	batchCheckedAt time.Time
}

var _ drain.Handler = (*Forwarder)(nil)

// New returns a Forwarder publishing through js. It fails with
// ErrInvalidConfig when js is nil, Prefix is not a literal subject, or
// MaxInFlight or PublishTimeout is negative.
func New(js jetstream.JetStream, cfg Config) (*Forwarder, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream context is nil", ErrInvalidConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = wire.DefaultEventsPrefix
	}
	if cfg.Source == "" {
		cfg.Source = DefaultSource
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if err := wire.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("%w: Config.Prefix: %w", ErrInvalidConfig, err)
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("%w: Config.MaxInFlight %d is negative", ErrInvalidConfig, cfg.MaxInFlight)
	}
	if cfg.PublishTimeout < 0 {
		return nil, fmt.Errorf("%w: Config.PublishTimeout %s is negative", ErrInvalidConfig, cfg.PublishTimeout)
	}
	spanName := "publish " + cfg.Prefix
	if cfg.Stream != "" {
		spanName = "publish " + cfg.Stream
	}
	return &Forwarder{js: js, cfg: cfg, log: cfg.Logger, positions: make(map[string]position), batcher: newBatcher(js.Conn()),
		tracer: tracing.Tracer(cfg.TracerProvider), spanName: spanName}, nil
}

// Publish publishes events and returns one Outcome per event, in the same
// order. Events of one stream are published strictly in the order given, each
// only after the previous one was acknowledged stored or duplicate; after a
// failure the stream's remaining events are not sent (errNotAttempted).
// Different streams are published concurrently, at most Config.MaxInFlight
// at a time. It reconciles as Handle does for a batch without Reconcile set.
func (f *Forwarder) Publish(ctx context.Context, events []event.Event) []Outcome {
	out := make([]Outcome, len(events))
	byStream := make(map[string][]int)
	var order []string
	for i, e := range events {
		if _, ok := byStream[e.Stream]; !ok {
			order = append(order, e.Stream)
		}
		byStream[e.Stream] = append(byStream[e.Stream], i)
	}
	f.parallel(len(order), func(k int) {
		idx := byStream[order[k]]
		evs := make([]event.Event, len(idx))
		for j, i := range idx {
			evs[j] = events[i]
		}
		for j, o := range f.publishStream(ctx, order[k], evs, -1, false, false) {
			out[idx[j]] = o
		}
	})
	return out
}

// Handle implements drain.Handler: it publishes each batch's events in order
// and returns one Result per batch. Result.Done counts the leading events
// stored, duplicate or already stored; Result.Err is the failure of
// Events[Done]: a drain.NonRetryableError for ErrTooLarge, errInvalidData
// and errWrongStream, a drain.UnavailableError when the bus failed,
// otherwise retryable (ErrConflict among others). Batches of different
// streams are published concurrently (at most Config.MaxInFlight); batches
// of the same stream one after the other, and none after a failed one.
//
// Before publishing, a batch is reconciled with JetStream when its
// Reconcile flag is set (a takeover, a retry, an attempt after an outage),
// or when this Forwarder has not itself published the stream up to the
// batch's first event and that event is past version 0: the last message
// stored on the stream's subjects is looked up, and the events up to its
// ce-streamversion count as done (AlreadyStored) without being sent. A batch from version 0 without
// Reconcile (a new stream, or one reset to its start) is published whole,
// so a reset re-publishes; JetStream's duplicate window drops what it still
// remembers.
//
// A stream with one batch, whose position this Forwarder knows (it
// published the stream up to the batch's first event, and the batch does
// not reconcile) and whose events can all be batched, is sent without a
// goroutine of its own: all such streams of the call (at most
// MaxInFlight) are sent first, a single event as one message and a run as
// a fast batch, and their PubAcks are then waited for together.
func (f *Forwarder) Handle(ctx context.Context, batches []drain.Batch) []drain.Result {
	out := make([]drain.Result, len(batches))
	byStream := make(map[string][]int)
	var order []string
	for i, b := range batches {
		if _, ok := byStream[b.Stream]; !ok {
			order = append(order, b.Stream)
		}
		byStream[b.Stream] = append(byStream[b.Stream], i)
	}
	// Streams with one batch whose position is known go out first, all
	// of them, and their answers are waited for together (see ahead.go);
	// the others, one goroutine each, meanwhile, and batches JetStream
	// refused as batches after.
	var sent []ahead
	slow := order
	if ctx.Err() == nil {
		sent = make([]ahead, 0, len(order))
		slow = make([]string, 0, len(order))
		batchOK := f.batchOKCached()
		msg := &nats.Msg{Header: make(nats.Header, 15)} // reused: PublishMsg copies it out
		for _, s := range order {
			if idx := byStream[s]; len(idx) == 1 && len(sent) < f.cfg.MaxInFlight {
				if a, ok := f.sendAhead(ctx, batches[idx[0]], batchOK, msg); ok {
					a.i = idx[0]
					sent = append(sent, a)
					continue
				}
			}
			slow = append(slow, s)
		}
	}
	deadline := f.aheadDeadline()
	f.handleStreams(ctx, batches, byStream, slow, out)
	var refused []string
	for _, a := range sent {
		r, retry := f.settleAhead(ctx, a, deadline)
		if retry {
			refused = append(refused, batches[a.i].Stream)
			continue
		}
		out[a.i] = r
	}
	f.handleStreams(ctx, batches, byStream, refused, out)
	return out
}

// handleStreams publishes the batches of streams (byStream gives each
// stream's batches in order) as handleBatch does, concurrently (at most
// MaxInFlight at once), one batch of a stream after the other and none
// after a failed one, filling their results in out.
func (f *Forwarder) handleStreams(ctx context.Context, batches []drain.Batch, byStream map[string][]int, streams []string, out []drain.Result) {
	if len(streams) == 0 {
		return
	}
	f.parallel(len(streams), func(k int) {
		var failed error
		for _, i := range byStream[streams[k]] {
			b := batches[i]
			if failed != nil {
				out[i] = drain.Result{Err: fmt.Errorf("%w (stream %q: %v)", errNotAttempted, b.Stream, failed)}
				continue
			}
			out[i] = f.handleBatch(ctx, b)
			failed = out[i].Err
		}
	})
}

// handleBatch publishes one batch in order, stopping at the first failure.
func (f *Forwarder) handleBatch(ctx context.Context, b drain.Batch) drain.Result {
	evs := b.Events
	var wrong error
	for i, e := range evs {
		if e.Stream != b.Stream {
			wrong = drain.NonRetryable(fmt.Errorf("%w: event %d is of stream %q, in the batch of stream %q", errWrongStream, e.ID, e.Stream, b.Stream))
			evs = evs[:i]
			break
		}
	}
	if len(evs) > 0 {
		for i, o := range f.publishStream(ctx, b.Stream, evs, b.Watermark, b.Reconcile, true) {
			if o.Status == Failed {
				return drain.Result{Done: i, Err: o.Err}
			}
		}
	}
	if wrong != nil {
		f.log.Warn("publish failed", "stream", b.Stream, "event_id", b.Events[len(evs)].ID, "error", wrong, "retryable", false)
		return drain.Result{Done: len(evs), Err: wrong}
	}
	return drain.Result{Done: len(evs)}
}

// parallel runs fn(0..n-1) with at most MaxInFlight running at once.
func (f *Forwarder) parallel(n int, fn func(k int)) {
	if n == 1 {
		fn(0)
		return
	}
	sem := make(chan struct{}, f.cfg.MaxInFlight)
	var wg sync.WaitGroup
	for k := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(k)
		})
	}
	wg.Wait()
}
