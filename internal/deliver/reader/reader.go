// Package reader is a consumer replica's one read of the events stream in
// the shared engine (docs/design/next-engine.md, "The reader" and "What a
// new owner does"): an R1, memory, AckNone ordered consumer of every
// event (nats.go's OrderedConsumer, which recreates itself from the last
// sequence it delivered when its server goes or a delivery is missed),
// handing on in stream order the events of the partitions the replica
// owns and dropping the others, and the catch-up that brings a partition
// taken below the reader's head up to it by batched direct gets; and the
// cursors (Cursor), a subscription's own read of its events by direct
// gets up to a target the caller gives, the reader's head.
//
// A Reader is driven by one goroutine, the replica's dispatch loop: Next,
// Take, Release and Head are not safe for concurrent use, and that is
// what makes a take-over exact — the head cannot move while the loop
// decides where a partition starts. A Cursor is driven by one goroutine
// too, any one: it shares only the connection and the configuration with
// the Reader it came from. Nothing in the engine uses them yet (the
// design's stage 6 wires them in).
//
// Direct gets may be answered by any replica of the stream, and a
// follower that lags answers short: below the target. A read never takes
// that for the end; it reads again, and after ShortReads short answers
// in a row asks the stream's leader ($JS.API.STREAM.MSG.GET), which
// alone knows what the stream holds.
package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrInvalidConfig is wrapped by Open and NewCursor for a Config field,
// start sequence or filter they cannot use; the message names the field
// and the value.
var ErrInvalidConfig = errors.New("invalid reader config")

// ErrBehind is wrapped by Reader.Next and Cursor.Next when a read's
// direct gets answered below its target ShortReads times in a row and
// the stream's leader did not answer either (an election, the stream
// deleted): the read stays where it was; the caller tries again later,
// or releases the partitions being caught up.
var ErrBehind = errors.New("events stream answers below the read's target")

// ErrNoDirectGet is wrapped by Reader.Next and Cursor.Next when nobody
// answers a direct get: the events stream has AllowDirect off.
var ErrNoDirectGet = errors.New("events stream answers no direct gets (AllowDirect off)")

// Config configures a Reader. The zero value reads "events.>" of EVENTS
// in 16 partitions.
type Config struct {
	// Stream is the JetStream stream of the events. Default
	// wire.DefaultEventsStream ("EVENTS").
	Stream string
	// Prefix is the events' subject prefix. Default
	// wire.DefaultEventsPrefix ("events"). The reader reads
	// wire.All(Prefix) and finds each event's partition with
	// wire.SubjectPartition.
	Prefix string
	// Partitions is P, the number of partitions (the consumer's
	// --partitions). Default 16; at most 1024.
	Partitions int
	// Name prefixes the reader's consumer names, "<Name>_<n>" (n counts
	// its recreations), so `nats consumer ls` shows whose it is. Default
	// "jsbridge_reader".
	Name string
	// InactiveThreshold is how long the server keeps the reader's
	// consumer once nobody pulls (a dead replica's). Default 30 s.
	InactiveThreshold time.Duration
	// Batch is how many events one direct get of the catch-up or of a
	// cursor asks for. Default 256.
	Batch int
	// ReadTimeout bounds the wait for each message of a direct get's
	// answer, and for the leader's answer. Default 5 s.
	ReadTimeout time.Duration
	// ShortReads is how many direct get answers in a row that ended
	// below the read's target (neither a full batch nor reaching past
	// the target) a read takes before it asks the stream's leader; after
	// the leader answered an event, the next short answer goes to the
	// leader at once. Default 3.
	ShortReads int
	// Archetype is the engine's; its logger receives the reader's
	// recreations and skipped subjects (Debug). Default base.Default.
	*base.Archetype
}

func (c Config) withDefaults() (Config, error) {
	if c.Stream == "" {
		c.Stream = wire.DefaultEventsStream
	}
	if c.Prefix == "" {
		c.Prefix = wire.DefaultEventsPrefix
	}
	if err := wire.ValidatePrefix(c.Prefix); err != nil {
		return c, fmt.Errorf("%w: Prefix: %w", ErrInvalidConfig, err)
	}
	if c.Partitions == 0 {
		c.Partitions = 16
	}
	if c.Partitions < 1 || c.Partitions > 1024 {
		return c, fmt.Errorf("%w: Partitions %d: want 1 to 1024", ErrInvalidConfig, c.Partitions)
	}
	if c.Name == "" {
		c.Name = "jsbridge_reader"
	}
	if c.InactiveThreshold == 0 {
		c.InactiveThreshold = 30 * time.Second
	}
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 5 * time.Second
	}
	if c.ShortReads == 0 {
		c.ShortReads = 3
	}
	for _, f := range []struct {
		name string
		bad  bool
		val  any
	}{
		{"InactiveThreshold", c.InactiveThreshold < 0, c.InactiveThreshold},
		{"Batch", c.Batch < 0, c.Batch},
		{"ReadTimeout", c.ReadTimeout < 0, c.ReadTimeout},
		{"ShortReads", c.ShortReads < 0, c.ShortReads},
	} {
		if f.bad {
			return c, fmt.Errorf("%w: %s %v is negative", ErrInvalidConfig, f.name, f.val)
		}
	}
	c.Archetype = base.Default(c.Archetype)
	return c, nil
}

// Event is one event of the events stream, handed on by Next.
type Event struct {
	// Seq is its sequence in the events stream.
	Seq uint64
	// Subject is its subject as stored, "<prefix>.<category>.<stream>.<name>".
	Subject string
	// Partition is wire.SubjectPartition of Subject.
	Partition int
	// Header holds the message's headers as published (the bridge's
	// CloudEvents attributes and Nats-Msg-Id), whichever read it came from.
	Header nats.Header
	// Data is the message's body.
	Data []byte
	// Time is when the events stream stored it.
	Time time.Time
	// Envelope is where the webhooks built of the event keep its
	// structured-mode body, built by the first of them that needs it:
	// every copy of the Event (one per subscription that takes it, and
	// its retries) points to the same one. Set on every event Next and
	// the cursors hand on; nil (an Event made by hand) builds the body
	// for each webhook.
	Envelope *Envelope
}

// Envelope holds the body the webhooks of one event share: in
// structured mode the CloudEvents envelope is the same bytes for every
// subscription (each signs them with its own secret), so it is built,
// and its data checked to be JSON, once an event rather than once a
// webhook. The reader knows nothing of how it is built. The zero value
// is ready; it is safe for concurrent use.
type Envelope struct {
	once sync.Once
	body []byte
	err  error

	// parentOnce and parent memoize Parent: the trace context the
	// event's headers carry, read once an event.
	parentOnce sync.Once
	parent     any
}

// Body returns what build returned the first time Body was called on e,
// calling it only then; the callers share the bytes and must not
// change them. On a nil Envelope it calls build every time.
func (e *Envelope) Body(build func() ([]byte, error)) ([]byte, error) {
	if e == nil {
		return build()
	}
	e.once.Do(func() { e.body, e.err = build() })
	return e.body, e.err
}

// Parent returns what extract returned the first time Parent was called
// on e, calling it only then: the event's trace parent as its webhooks'
// spans read it from its headers (a scan of them when it has none).
// The reader knows nothing of what it is. On a nil Envelope it calls
// extract every time.
func (e *Envelope) Parent(extract func() any) any {
	if e == nil {
		return extract()
	}
	e.parentOnce.Do(func() { e.parent = extract() })
	return e.parent
}

// Reader reads the events stream once for a consumer replica. Make one
// with Open.
type Reader struct {
	cfg  Config
	js   jetstream.JetStream
	get  direct
	oc   jetstream.Consumer
	it   jetstream.MessagesContext
	stop sync.Once

	head     uint64   // last sequence read live, handed on or dropped
	owned    []bool   // by partition
	liveFrom []uint64 // by partition: the first sequence handed on live
	catch    catchUp
	// unpartitioned counts the subjects read live that were no event's
	// (not three tokens after the prefix), passed over.
	unpartitioned uint64
	// waitCtx and waitOpt are the context of the last live wait and its
	// jetstream.NextContext option, made again only when the context
	// changes: the dispatch loop keeps one wait context across events,
	// and the option is an allocation a call.
	waitCtx context.Context
	waitOpt jetstream.NextOpt
}

// Open starts a reader of cfg.Stream on js from sequence from (1 or
// more), owning no partition: every event is dropped until Take. The
// replica opens it after its first membership round, from the lowest
// floor + 1 of the partitions it claimed, so that they need no
// catch-up. It fails when cfg or from is invalid (ErrInvalidConfig) or
// the consumer cannot be created.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config, from uint64) (*Reader, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if from < 1 {
		return nil, fmt.Errorf("%w: start sequence %d: want 1 or more", ErrInvalidConfig, from)
	}
	oc, err := js.OrderedConsumer(ctx, cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{wire.All(cfg.Prefix)},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		InactiveThreshold: cfg.InactiveThreshold,
		NamePrefix:        cfg.Name,
	})
	if err != nil {
		return nil, fmt.Errorf("reader of %s: create its consumer: %w", cfg.Stream, err)
	}
	it, err := oc.Messages()
	if err != nil {
		return nil, fmt.Errorf("reader of %s: read its consumer: %w", cfg.Stream, err)
	}
	return &Reader{cfg: cfg, js: js, get: direct{js: js, cfg: cfg}, oc: oc, it: it, head: from - 1,
		owned: make([]bool, cfg.Partitions), liveFrom: make([]uint64, cfg.Partitions)}, nil
}

// Take makes partition p the replica's from just after floor, the last
// sequence of p settled by every subscription (pos.p<N>'s floor). When
// floor is at or past Head, p's events above floor are handed on as the
// reader reads them. When it is below, the reader has already passed p's
// events in (floor, Head]: Next hands those on first, read by batched
// direct gets (the catch-up, shared by every partition taken below the
// head until it ends), and p's live events from Head + 1. It fails for a
// partition out of range or already taken.
func (r *Reader) Take(p int, floor uint64) error {
	if p < 0 || p >= len(r.owned) {
		return fmt.Errorf("reader: take partition %d: want 0 to %d", p, len(r.owned)-1)
	}
	if r.owned[p] {
		return fmt.Errorf("reader: take partition %d: already taken", p)
	}
	r.owned[p] = true
	if floor >= r.head {
		r.liveFrom[p] = floor + 1
		return nil
	}
	r.liveFrom[p] = r.head + 1
	r.catch.add(p, floor, r.head)
	return nil
}

// Release stops handing on partition p's events, live or caught up, from
// the next call of Next. Releasing a partition not taken does nothing.
func (r *Reader) Release(p int) {
	if p < 0 || p >= len(r.owned) {
		return
	}
	r.owned[p] = false
	r.catch.drop(p)
}

// Next returns the next event of a partition taken, each partition's in
// stream order: a partition taken at or above the head, live from its
// floor on; one taken below it, first its events up to the head (the
// catch-up), then live. While a catch-up runs the live read goes on
// between its batches (at most Batch/2 messages a batch, those the
// reader has at hand), handing on the live partitions' events and
// moving the catch-up's target past the caught-up partitions' ones; the
// catch-up ends when it reaches the head, and its partitions go live
// from there. It blocks until there
// is one or ctx ends. A catch-up that cannot reach its target returns an
// error wrapping ErrBehind or ErrNoDirectGet (the partitions stay taken,
// their catch-up where it was: call Next again, or Release them). When the reader's server
// goes, nats.go recreates its consumer from the last sequence read + 1
// and Next goes on; its error is ctx's, or the consumer's when it was
// stopped.
func (r *Reader) Next(ctx context.Context) (Event, error) {
	for {
		ev, ok, poll, err := r.nextCaughtUp(ctx)
		if err != nil || ok {
			return ev, err
		}
		var m jetstream.Msg
		if poll {
			// The catch-up's live turn: what the reader has at hand, not
			// a wait for more.
			if m, err = r.it.Next(jetstream.NextMaxWait(livePoll)); errors.Is(err, nats.ErrTimeout) {
				r.catch.turn = 0
				continue
			}
			r.catch.turn--
		} else {
			m, err = r.it.Next(r.waitOption(ctx))
		}
		if err != nil {
			return Event{}, fmt.Errorf("reader of %s: %w", r.cfg.Stream, err)
		}
		if ev, ok, err := r.live(m); err != nil || ok {
			return ev, err
		}
	}
}

// waitOption returns jetstream.NextContext(ctx), made once for each
// context in a row.
func (r *Reader) waitOption(ctx context.Context) jetstream.NextOpt {
	if r.waitOpt == nil || r.waitCtx != ctx {
		r.waitCtx, r.waitOpt = ctx, jetstream.NextContext(ctx)
	}
	return r.waitOpt
}

// livePoll is how long the catch-up's live turn waits for a message the
// reader does not have at hand.
const livePoll = time.Millisecond

// live moves the head to m, read live, and returns its event when it is
// to be handed on: of a partition taken, live at m. A partition being
// caught up is not live yet: its catch-up's target moves to m, so that
// the catch-up reads it again, in its order.
func (r *Reader) live(m jetstream.Msg) (Event, bool, error) {
	md, err := m.Metadata()
	if err != nil {
		return Event{}, false, fmt.Errorf("reader of %s: a message without metadata: %w", r.cfg.Stream, err)
	}
	r.head = md.Sequence.Stream
	p, ok := wire.SubjectPartition(r.cfg.Prefix, m.Subject(), len(r.owned))
	if !ok {
		r.unpartitioned++
		r.cfg.Logger.Debug("reader passed over a subject of no event", slog.String("subject", m.Subject()),
			slog.Uint64("seq", r.head))
		return Event{}, false, nil
	}
	if _, catching := r.catch.after[p]; catching {
		r.catch.to = r.head
		return Event{}, false, nil
	}
	if !r.owned[p] || r.head < r.liveFrom[p] {
		return Event{}, false, nil
	}
	return Event{Seq: r.head, Subject: m.Subject(), Partition: p, Header: m.Headers(), Data: m.Data(),
		Time: md.Timestamp, Envelope: new(Envelope)}, true, nil
}

// Stop ends the live read and deletes the reader's current consumer
// (the server would after InactiveThreshold). Next returns an error
// after it. A second Stop does nothing. The reader is a resource of
// the goroutine that calls Next (the replica's dispatch loop, a
// lifecycle.Part that opens it and stops it as it ends), not a
// long-running part of its own: it starts no goroutine (Stop ends those
// of nats.go's iterator).
func (r *Reader) Stop() {
	r.stop.Do(func() {
		r.it.Stop()
		if info := r.oc.CachedInfo(); info != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = r.js.DeleteConsumer(ctx, r.cfg.Stream, info.Name)
		}
	})
}
