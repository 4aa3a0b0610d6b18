package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
)

// Defaults of Config.
const (
	// DefaultPrefix is the subject prefix: subjects are "events.>".
	DefaultPrefix = "events"
	// DefaultSource is the CloudEvents source attribute (ce-source).
	DefaultSource = "jsbridge"
	// DefaultMaxInFlight is how many streams are published concurrently.
	DefaultMaxInFlight = 256
	// DefaultPublishTimeout bounds one publish, from send to PubAck.
	DefaultPublishTimeout = 5 * time.Second
)

// ErrInvalidData is wrapped (inside a drain.NonRetryableError) in the error of
// an event whose data is not valid JSON.
var ErrInvalidData = errors.New("event data is not valid JSON")

// ErrTooLarge is wrapped (inside a drain.NonRetryableError) in the error of an
// event whose message exceeds the server's max payload or the JetStream
// stream's maximum message size.
var ErrTooLarge = errors.New("message too large")

// ErrNotAttempted is the (retryable) error of an event that was not published
// because an earlier event of the same stream failed: sending it would break
// the stream's order in JetStream.
var ErrNotAttempted = errors.New("not published: an earlier event of the stream failed")

// ErrWrongStream is wrapped (inside a drain.NonRetryableError) in the error of
// an event handed to Handle in the batch of another stream.
var ErrWrongStream = errors.New("event belongs to another stream")

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
	// stream publishes are strictly sequential. Default 256.
	MaxInFlight int
	// PublishTimeout bounds one publish, from send to PubAck. Default 5 s.
	PublishTimeout time.Duration
	// Logger receives failures (Warn), duplicates and stores (Debug) with the
	// keys stream and event_id. Default: discard.
	Logger *slog.Logger
	// Observer is told about every publish (metrics). Default: none.
	Observer Observer
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
)

// String returns "failed", "stored" or "duplicate".
func (s Status) String() string {
	switch s {
	case Stored:
		return "stored"
	case Duplicate:
		return "duplicate"
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
	// Duplicate, the sequence of the message already stored); 0 when Failed.
	Sequence uint64
	// Err is nil unless Failed. Non-retryable failures are
	// drain.NonRetryableError wrapping ErrTooLarge or ErrInvalidData; events
	// after a failed one of the same stream get ErrNotAttempted.
	Err error
	// Retryable reports whether publishing the event again may succeed:
	// false for a drain.NonRetryableError, true for every other failure.
	Retryable bool
}

// Forwarder publishes events to JetStream, keeping each stream's order. It is
// a drain.Handler. Safe for concurrent use, but two concurrent calls must not
// publish the same stream (the drain's lease guarantees that).
type Forwarder struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger
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
		cfg.Prefix = DefaultPrefix
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
	if err := validPrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("%w: Config.Prefix: %w", ErrInvalidConfig, err)
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("%w: Config.MaxInFlight %d is negative", ErrInvalidConfig, cfg.MaxInFlight)
	}
	if cfg.PublishTimeout < 0 {
		return nil, fmt.Errorf("%w: Config.PublishTimeout %s is negative", ErrInvalidConfig, cfg.PublishTimeout)
	}
	return &Forwarder{js: js, cfg: cfg, log: cfg.Logger}, nil
}

// Publish publishes events and returns one Outcome per event, in the same
// order. Events of one stream are published strictly in the order given, each
// only after the previous one was acknowledged stored or duplicate; after a
// failure the stream's remaining events are not sent (ErrNotAttempted).
// Different streams are published concurrently, at most Config.MaxInFlight
// at a time.
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
		failed := -1
		for _, i := range byStream[order[k]] {
			if failed >= 0 {
				out[i] = notAttempted(events[i], events[failed])
				continue
			}
			out[i] = f.publish(ctx, events[i])
			if out[i].Status == Failed {
				failed = i
			}
		}
	})
	return out
}

// Handle implements drain.Handler: it publishes each batch's events in order
// and returns one Result per batch. Result.Done counts the leading events
// stored or duplicate; Result.Err is the failure of Events[Done] (a
// drain.NonRetryableError for ErrTooLarge, ErrInvalidData and
// ErrWrongStream, otherwise retryable). Batches of different streams are
// published concurrently (at most Config.MaxInFlight); batches of the same
// stream one after the other, and none after a failed one.
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
	f.parallel(len(order), func(k int) {
		var failed error
		for _, i := range byStream[order[k]] {
			b := batches[i]
			if failed != nil {
				out[i] = drain.Result{Err: fmt.Errorf("%w (stream %q: %v)", ErrNotAttempted, b.Stream, failed)}
				continue
			}
			out[i] = f.handleBatch(ctx, b)
			failed = out[i].Err
		}
	})
	return out
}

// handleBatch publishes one batch in order, stopping at the first failure.
func (f *Forwarder) handleBatch(ctx context.Context, b drain.Batch) drain.Result {
	for i, e := range b.Events {
		if e.Stream != b.Stream {
			err := drain.NonRetryable(fmt.Errorf("%w: event %d is of stream %q, in the batch of stream %q", ErrWrongStream, e.ID, e.Stream, b.Stream))
			f.log.Warn("publish failed", "stream", b.Stream, "event_id", e.ID, "error", err, "retryable", false)
			return drain.Result{Done: i, Err: err}
		}
		if o := f.publish(ctx, e); o.Status == Failed {
			return drain.Result{Done: i, Err: o.Err}
		}
	}
	return drain.Result{Done: len(b.Events)}
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

// publish sends one event, classifies the result and tells the Observer.
func (f *Forwarder) publish(ctx context.Context, e event.Event) Outcome {
	start := time.Now()
	o := f.publishOnce(ctx, e)
	f.cfg.Observer.Published(o, time.Since(start))
	return o
}

func (f *Forwarder) publishOnce(ctx context.Context, e event.Event) Outcome {
	if !json.Valid(e.Data) {
		return f.failed(e, drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes)", ErrInvalidData, e.ID, e.Stream, len(e.Data))))
	}
	msg := Message(e, f.cfg)
	var opts []jetstream.PublishOpt
	if f.cfg.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(f.cfg.Stream))
	}
	pctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	ack, err := f.js.PublishMsg(pctx, msg, opts...)
	cancel()
	if err != nil {
		if tooLarge(err) {
			return f.failed(e, drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes of data): %w", ErrTooLarge, e.ID, e.Stream, len(e.Data), err)))
		}
		return f.failed(e, fmt.Errorf("publish event %d of stream %q to %s: %w", e.ID, e.Stream, msg.Subject, err))
	}
	if ack.Duplicate {
		f.log.Debug("duplicate dropped by JetStream", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
		return Outcome{Status: Duplicate, Sequence: ack.Sequence}
	}
	f.log.Debug("event stored", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
	return Outcome{Status: Stored, Sequence: ack.Sequence}
}

// failed logs and returns a Failed outcome.
func (f *Forwarder) failed(e event.Event, err error) Outcome {
	retryable := !drain.IsNonRetryable(err)
	f.log.Warn("publish failed", "stream", e.Stream, "event_id", e.ID, "error", err, "retryable", retryable)
	return Outcome{Status: Failed, Err: err, Retryable: retryable}
}

// notAttempted is the outcome of e, skipped because prev failed.
func notAttempted(e, prev event.Event) Outcome {
	return Outcome{
		Status:    Failed,
		Err:       fmt.Errorf("%w: event %d of stream %q after failed event %d", ErrNotAttempted, e.ID, e.Stream, prev.ID),
		Retryable: true,
	}
}

// tooLarge reports whether err says the message exceeds the server's max
// payload (client-side check) or the stream's maximum message size.
func tooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}
