package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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

// ErrConflict is the (retryable) error of an event JetStream refused because
// the last message on its stream's subjects was not the one this Forwarder
// expected (Nats-Expected-Last-Subject-Sequence): another publisher stored a
// message of the stream meanwhile, typically a bridge whose lease expired
// while it was still publishing, or a publish that sat in a client's
// reconnect buffer. Nothing was stored; the drain retries the stream and the
// retry reconciles.
var ErrConflict = errors.New("stream changed in JetStream by another publisher")

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
	// PublishTimeout bounds one publish, from send to PubAck, and one
	// reconciliation lookup. Default 5 s. Under a drain, keep it within
	// MaxPublishTimeout of the drain's lease (see FitPublishTimeout): the
	// handler's context ends before it otherwise.
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
	// drain.NonRetryableError wrapping ErrTooLarge, ErrInvalidData or the
	// event's own Err (an event the store could not read); failures of the
	// bus (timeouts, a publish or lookup cut short by the context before
	// JetStream answered, no server or stream answering, a closed or
	// reconnecting connection, a JetStream API 503) are
	// drain.UnavailableError; a refused expectation wraps ErrConflict;
	// events after a failed one of the same stream get ErrNotAttempted.
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

	mu        sync.Mutex
	positions map[string]position // per stream, what this Forwarder last saw stored
	stream    jetstream.Stream    // for reconciliation; resolved on first use
	// Whether the JetStream stream allows fast batches (allow_batched),
	// as of batchCheckedAt; looked up again after batchRecheck.
	batchOK        bool
	batchCheckedAt time.Time
}

// batchRecheck is how often the Forwarder looks again whether the
// JetStream stream allows fast batches (an operator may turn it on).
const batchRecheck = time.Minute

// maxPositions bounds Forwarder.positions: about 100 bytes each.
const maxPositions = 100_000

// position is where a stream stands in JetStream as this Forwarder last
// saw it.
type position struct {
	seq  uint64 // JetStream sequence of the last message on the stream's subjects; 0: none
	next int64  // version of the event expected next
}

// stored is what reconciliation found for a stream in JetStream.
type stored struct {
	found   bool
	seq     uint64 // sequence of the stream's last message
	version int64  // its ce-streamversion; -1 when absent or unreadable
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
	return &Forwarder{js: js, cfg: cfg, log: cfg.Logger, positions: make(map[string]position), batcher: newBatcher(js.Conn())}, nil
}

// Publish publishes events and returns one Outcome per event, in the same
// order. Events of one stream are published strictly in the order given, each
// only after the previous one was acknowledged stored or duplicate; after a
// failure the stream's remaining events are not sent (ErrNotAttempted).
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
		for j, o := range f.publishStream(ctx, order[k], evs, false, false) {
			out[idx[j]] = o
		}
	})
	return out
}

// Handle implements drain.Handler: it publishes each batch's events in order
// and returns one Result per batch. Result.Done counts the leading events
// stored, duplicate or already stored; Result.Err is the failure of
// Events[Done]: a drain.NonRetryableError for ErrTooLarge, ErrInvalidData
// and ErrWrongStream, a drain.UnavailableError when the bus failed,
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
	evs := b.Events
	var wrong error
	for i, e := range evs {
		if e.Stream != b.Stream {
			wrong = drain.NonRetryable(fmt.Errorf("%w: event %d is of stream %q, in the batch of stream %q", ErrWrongStream, e.ID, e.Stream, b.Stream))
			evs = evs[:i]
			break
		}
	}
	if len(evs) > 0 {
		for i, o := range f.publishStream(ctx, b.Stream, evs, b.Reconcile, true) {
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

// publishStream publishes evs, all of stream and in version order, each
// only after the previous one is stored; it reconciles first when the
// position is not known (see Handle). With batch set, runs of events that
// cannot be duplicates (the stream continues where this Forwarder or
// JetStream left it) go out as fast batches when the JetStream stream
// allows them (see batch.go), else one at a time, each expecting the last
// message the previous one left (see Forwarder). It returns one Outcome per
// event.
func (f *Forwarder) publishStream(ctx context.Context, stream string, evs []event.Event, reconcile, batch bool) []Outcome {
	out := make([]Outcome, len(evs))
	pos, known := f.position(stream, evs[0].Version, reconcile)
	start := 0
	// fresh: no event from start on can be in JetStream already, so a
	// batch's count of handled messages is a count of stored ones.
	fresh := known
	if !known {
		began := time.Now()
		last, err := f.lastStored(ctx, stream)
		if err != nil {
			out[0] = f.failed(evs[0], err)
			f.cfg.Observer.Published(out[0], time.Since(began))
			for i := 1; i < len(evs); i++ {
				out[i] = notAttempted(evs[i], evs[0])
			}
			return out
		}
		pos.seq = last.seq
		if last.found && (reconcile || evs[0].Version > 0) {
			for start < len(evs) && evs[start].Version <= last.version {
				out[start] = Outcome{Status: AlreadyStored, Sequence: last.seq}
				start++
			}
			if start > 0 {
				f.log.Info("reconciled with JetStream: events already stored are not published again",
					"stream", stream, "event_id", evs[start-1].ID, "version", evs[start-1].Version, "events", start, "sequence", last.seq)
			}
		}
		fresh = !last.found || (last.version >= 0 && start < len(evs) && evs[start].Version > last.version)
	}
	if batch && fresh && len(evs)-start >= 2 {
		began := time.Now()
		ok, err := f.batching(ctx)
		if err != nil {
			// JetStream did not answer the lookup: the publish would fare
			// no better. Nothing was sent; what this Forwarder knows of
			// the stream still holds.
			out[start] = f.failed(evs[start], fmt.Errorf("publish event %d of stream %q: %w", evs[start].ID, stream, err))
			f.cfg.Observer.Published(out[start], time.Since(began))
			for i := start + 1; i < len(evs); i++ {
				out[i] = notAttempted(evs[i], evs[start])
			}
			return out
		}
		batch = ok
	} else {
		batch = false
	}
	for i := start; i < len(evs); {
		if batch {
			j := i
			for j < len(evs) && f.batchable(evs[j]) {
				j++
			}
			if j-i >= 2 {
				began := time.Now()
				r := f.publishBatch(ctx, stream, evs[i:j], pos.seq)
				if errors.Is(r.Err, errBatchRefused) {
					// Too many batches in flight: this one goes one at a
					// time. Not allowed at all: so do all, until the next
					// look at the stream's configuration.
					f.log.Debug("JetStream refused a fast batch; publishing one event at a time", "stream", stream, "error", r.Err)
					if errors.Is(r.Err, errBatchDisabled) {
						f.noBatching()
					}
					batch = false
					continue
				}
				took := time.Since(began)
				for k := range r.Done {
					out[i+k] = Outcome{Status: Stored}
					if k == r.Done-1 {
						out[i+k].Sequence = r.Sequence
					}
					f.cfg.Observer.Published(out[i+k], took)
				}
				if r.Err != nil {
					k := i + r.Done
					out[k] = f.failed(evs[k], r.Err)
					f.cfg.Observer.Published(out[k], took)
					f.forget(stream)
					for m := k + 1; m < len(evs); m++ {
						out[m] = notAttempted(evs[m], evs[k])
					}
					return out
				}
				f.log.Debug("events stored", "stream", stream, "event_id", evs[j-1].ID, "events", j-i, "sequence", r.Sequence)
				// 0 when all were duplicates after all: then the last
				// message on the stream's subjects is not known.
				pos.seq = r.Sequence
				i = j
				continue
			}
		}
		out[i] = f.publish(ctx, evs[i], stream, pos.seq)
		switch out[i].Status {
		case Stored:
			pos.seq = out[i].Sequence
		case Failed:
			// The outcome may be unknown (a timeout): look it up next time.
			f.forget(stream)
			for j := i + 1; j < len(evs); j++ {
				out[j] = notAttempted(evs[j], evs[i])
			}
			return out
		}
		// Duplicate: JetStream checked the expectation first, so the last
		// message is still pos.seq.
		i++
	}
	if pos.seq == 0 && start < len(evs) {
		// Nothing was stored (all duplicates): look the stream up next time.
		f.forget(stream)
		return out
	}
	pos.next = evs[len(evs)-1].Version + 1
	f.remember(stream, pos)
	return out
}

// batchable reports whether e can go in a fast batch: its data is JSON and
// its message well under the server's max payload. Others are published
// alone, which reports their failure exactly.
func (f *Forwarder) batchable(e event.Event) bool {
	const headroom = 4 << 10 // the headers, generously
	return e.Err == nil && int64(len(e.Data))+headroom <= f.js.Conn().MaxPayload() && json.Valid(e.Data)
}

// batching reports whether the JetStream stream allows fast batches
// (allow_batched, nats-server 2.14+), looking it up at most once per
// batchRecheck. When JetStream does not answer the lookup (an outage, or
// the cycle's deadline cut it short) it returns a drain.UnavailableError
// and looks again next time; any other failure of the lookup (no
// permission for stream info, say) counts as "no fast batches" until the
// next look.
func (f *Forwarder) batching(ctx context.Context) (bool, error) {
	f.mu.Lock()
	ok, at := f.batchOK, f.batchCheckedAt
	f.mu.Unlock()
	if !at.IsZero() && time.Since(at) < batchRecheck {
		return ok, nil
	}
	ok = false
	lctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	s, err := f.jsStream(lctx, f.cfg.Prefix+".>")
	if err == nil {
		var info *jetstream.StreamInfo
		if info, err = s.Info(lctx); err == nil {
			ok = info.Config.AllowBatchPublish
		}
	}
	if err != nil {
		if err = classify(fmt.Errorf("look up whether JetStream stream allows fast batches: %w", err)); drain.IsUnavailable(err) {
			return false, err
		}
	}
	f.mu.Lock()
	f.batchOK, f.batchCheckedAt = ok, time.Now()
	f.mu.Unlock()
	return ok, nil
}

// noBatching stops fast batches until the next look (batchRecheck).
func (f *Forwarder) noBatching() {
	f.mu.Lock()
	f.batchOK, f.batchCheckedAt = false, time.Now()
	f.mu.Unlock()
}

// position returns what this Forwarder knows of stream when it is usable:
// not reconciling, and the stream left off just before version.
func (f *Forwarder) position(stream string, version int64, reconcile bool) (position, bool) {
	if reconcile {
		return position{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.positions[stream]
	if !ok || p.next != version {
		return position{}, false
	}
	return p, true
}

func (f *Forwarder) remember(stream string, p position) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.positions[stream]; !ok && len(f.positions) >= maxPositions {
		for k := range f.positions { // an arbitrary one
			delete(f.positions, k)
			break
		}
	}
	f.positions[stream] = p
}

func (f *Forwarder) forget(stream string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.positions, stream)
}

// lastStored looks up the last message JetStream holds on stream's
// subjects.
func (f *Forwarder) lastStored(ctx context.Context, stream string) (stored, error) {
	filter := StreamFilter(f.cfg.Prefix, stream)
	lctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	s, err := f.jsStream(lctx, filter)
	if err != nil {
		return stored{}, classify(fmt.Errorf("reconcile stream %q: find the JetStream stream of %s: %w", stream, filter, err))
	}
	m, err := s.GetLastMsgForSubject(lctx, filter)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return stored{version: -1}, nil
	case err != nil:
		f.mu.Lock()
		f.stream = nil // it may have been deleted and created again
		f.mu.Unlock()
		return stored{}, classify(fmt.Errorf("reconcile stream %q: last message on %s: %w", stream, filter, err))
	}
	v, perr := strconv.ParseInt(m.Header.Get(event.HeaderStreamVersion), 10, 64)
	if perr != nil {
		f.log.Warn("last message of the stream in JetStream has no readable "+event.HeaderStreamVersion+"; nothing is skipped",
			"stream", stream, "sequence", m.Sequence, "subject", m.Subject)
		v = -1
	}
	return stored{found: true, seq: m.Sequence, version: v}, nil
}

// jsStream returns the JetStream stream handle for lookups: Config.Stream,
// or the stream holding subject.
func (f *Forwarder) jsStream(ctx context.Context, subject string) (jetstream.Stream, error) {
	f.mu.Lock()
	s := f.stream
	f.mu.Unlock()
	if s != nil {
		return s, nil
	}
	name := f.cfg.Stream
	if name == "" {
		var err error
		if name, err = f.js.StreamNameBySubject(ctx, subject); err != nil {
			return nil, err
		}
	}
	s, err := f.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.stream = s
	f.mu.Unlock()
	return s, nil
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

// publish sends one event expecting lastSeq as the last sequence on the
// stream's subjects, classifies the result and tells the Observer.
func (f *Forwarder) publish(ctx context.Context, e event.Event, stream string, lastSeq uint64) Outcome {
	start := time.Now()
	o := f.publishOnce(ctx, e, stream, lastSeq)
	f.cfg.Observer.Published(o, time.Since(start))
	return o
}

func (f *Forwarder) publishOnce(ctx context.Context, e event.Event, stream string, lastSeq uint64) Outcome {
	if e.Err != nil {
		// The store could not read it (event.Event.Err): the drain never
		// hands it over, but Publish takes any event.
		return f.failed(e, drain.NonRetryable(fmt.Errorf("event %d of stream %q cannot be read: %w", e.ID, e.Stream, e.Err)))
	}
	if !json.Valid(e.Data) {
		return f.failed(e, drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes)", ErrInvalidData, e.ID, e.Stream, len(e.Data))))
	}
	msg := Message(e, f.cfg)
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequenceForSubject(lastSeq, StreamFilter(f.cfg.Prefix, stream))}
	if f.cfg.Stream != "" {
		opts = append(opts, jetstream.WithExpectStream(f.cfg.Stream))
	}
	ack, err := f.publishAndWait(ctx, msg, opts)
	if err != nil {
		return f.failed(e, f.publishErr(e, stream, lastSeq, true, err))
	}
	if ack.Duplicate {
		f.log.Debug("duplicate dropped by JetStream", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
		return Outcome{Status: Duplicate, Sequence: ack.Sequence}
	}
	f.log.Debug("event stored", "stream", e.Stream, "event_id", e.ID, "sequence", ack.Sequence)
	return Outcome{Status: Stored, Sequence: ack.Sequence}
}

// publishErr classifies the refusal err of e: too large (non-retryable), a
// conflict with the expected last sequence (only the first message of a
// batch carries it; expected tells whether e did), or a failure of the bus.
func (f *Forwarder) publishErr(e event.Event, stream string, lastSeq uint64, expected bool, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case tooLarge(err):
		return drain.NonRetryable(fmt.Errorf("%w: event %d of stream %q (%d bytes of data): %w", ErrTooLarge, e.ID, e.Stream, len(e.Data), err))
	case expected && errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%w: event %d of stream %q: expected the stream's last message at sequence %d: %w", ErrConflict, e.ID, e.Stream, lastSeq, err)
	}
	return classify(fmt.Errorf("publish event %d of stream %q to %s: %w", e.ID, stream, Subject(f.cfg.Prefix, stream, e.Name), err))
}

// publishAndWait publishes msg asynchronously and waits for its PubAck, at
// most PublishTimeout. Async publishes from many streams share nats.go's
// write buffer and flusher, so the server gets them in batches instead of one
// flushed request each: the same ordering guarantee per stream (we still wait
// before the next event) at a fraction of the cost per message.
func (f *Forwarder) publishAndWait(ctx context.Context, msg *nats.Msg, opts []jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if err := ctx.Err(); err != nil {
		// Past the cycle's deadline (or shut down): a publish sent now
		// would go unanswered and its outcome stay unknown.
		return nil, fmt.Errorf("not sent: %w", err)
	}
	fut, err := f.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(f.cfg.PublishTimeout)
	defer t.Stop()
	select {
	case ack := <-fut.Ok():
		return ack, nil
	case err := <-fut.Err():
		return nil, err
	case <-t.C:
		return nil, fmt.Errorf("no PubAck within %s: %w", f.cfg.PublishTimeout, context.DeadlineExceeded)
	case <-ctx.Done():
		return nil, fmt.Errorf("no PubAck before the context ended (the cycle's deadline or shutdown): %w", ctx.Err())
	}
}

// classify wraps err as a drain.UnavailableError when it is a failure of
// the bus rather than of the event: JetStream did not answer in time (a
// publish or lookup timed out, or was cut short by the context: the
// cycle's deadline, or shutdown), no server or stream answering, a closed
// or reconnecting connection, or a JetStream API error with code 503
// (JetStream unavailable, insufficient resources). Anything else is
// returned as it is.
func classify(err error) error {
	switch ErrorClass(err) {
	case ClassTimeout, ClassCanceled, ClassNoResponders, ClassConnection:
		return drain.Unavailable(err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return drain.Unavailable(err)
	}
	return err
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
