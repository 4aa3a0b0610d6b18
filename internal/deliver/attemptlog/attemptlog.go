// Package attemptlog is the consumer's attempts record: every delivery
// attempt's outcome written, after it ended, to a JetStream stream bounded
// by age and size, for `consumer trace`. Writing is asynchronous and never
// holds a delivery up.
package attemptlog

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/promreg"
	"github.com/jsbridge/jsbridge/wire"
)

// Attempt is the record of one delivery attempt, as the consumer writes it
// to the attempts stream (JSON, these keys) and `consumer trace` reads it.
type Attempt struct {
	// Subscription is the subscription's name.
	Subscription string `json:"subscription"`
	// EventID is the event id (Nats-Msg-Id).
	EventID string `json:"event_id"`
	// Attempt is the attempt number, 1-based.
	Attempt int `json:"attempt"`
	// At is when the request was sent (when the attempt began if none was).
	At time.Time `json:"at"`
	// Replica names the consumer process that made the attempt
	// (Config.Replica).
	Replica string `json:"replica"`
	// Status is the HTTP status, 0 without a response.
	Status int `json:"status"`
	// StatusClass is 2xx..5xx, timeout, network, tls, forbidden or none.
	StatusClass string `json:"status_class"`
	// Outcome is the attempt's label of jsbridge_consumer_deliveries_total
	// (attempt.Outcome*: ack, retry, term, exhausted, breaker_open, ...).
	Outcome string `json:"outcome"`
	// Latency is the time from handing the request to the circuit breaker
	// to the response or error; 0 when nothing was sent. In JSON,
	// nanoseconds.
	Latency time.Duration `json:"latency_ns"`
	// Error says why the attempt failed ("" when acked), e.g.
	// "HTTP 503 Service Unavailable".
	Error string `json:"error,omitempty"`
	// Breaker is the endpoint's circuit breaker state after the attempt.
	Breaker string `json:"breaker"`
	// Subject and StreamSeq locate the message on the events stream.
	Subject   string `json:"subject"`
	StreamSeq uint64 `json:"stream_seq"`
	// TraceID is the OpenTelemetry trace id of the attempt's span, "" when
	// the message carried no trace context and tracing is off.
	TraceID string `json:"trace_id,omitempty"`
}

// Recorder receives every attempt after it ended (Config.Attempts).
// RecordAttempt is called on the delivery's goroutine and must neither
// block nor fail: a delivery never waits for its record. Log is the
// JetStream implementation.
type Recorder interface {
	RecordAttempt(Attempt)
}

// Defaults of Config.
const (
	// DefaultMaxAge is how long attempt records are kept (72 h).
	DefaultMaxAge = 72 * time.Hour
	// DefaultMaxBytes bounds the attempts stream's size (1 GiB);
	// the oldest records go first.
	DefaultMaxBytes = 1 << 30
	// DefaultBuffer is how many records may wait to be written;
	// more are dropped (and counted).
	DefaultBuffer = 4096
	// attemptsPending is how many writes may wait for their PubAck.
	attemptsPending = 1024
)

// ErrSubjects is returned (wrapped) by Log.Provision when
// the existing attempts stream does not hold <prefix>.>.
var ErrSubjects = errors.New("attempts stream does not hold the attempts subjects")

// Config configures a Log.
type Config struct {
	// Stream is the JetStream stream. Default "JSBRIDGE_ATTEMPTS".
	Stream string
	// SubjectPrefix is the first subject token; records go to
	// <prefix>.<subscription>.<event id> (wire.AttemptSubject). Default
	// "attempts".
	SubjectPrefix string
	// MaxAge is how long records are kept. Default 72 h.
	MaxAge time.Duration
	// MaxBytes bounds the stream's size; the oldest records are discarded.
	// Default 1 GiB.
	MaxBytes int64
	// Replicas is the stream's replica count when Provision creates it.
	// Default 1.
	Replicas int
	// Buffer is how many records may wait to be written. Default 4096.
	Buffer int
	// Archetype is the engine's clock (the write-failure warnings'
	// pace, the writes' linger and waits), logger (write failures, at
	// most one warning a minute) and replica id (named in every record).
	// Default base.Default.
	*base.Archetype
	// Registerer receives jsbridge_consumer_attempt_records_dropped_total.
	// Default nil: not registered.
	Registerer prometheus.Registerer
}

// Log writes attempt records to a JetStream stream, bounded by age
// and size, asynchronously: RecordAttempt only queues. A record that finds
// the queue full, or that JetStream does not store, is dropped and counted
// in jsbridge_consumer_attempt_records_dropped_total{reason="full"|"error"};
// deliveries never wait for or fail on it. Start it with Run.
type Log struct {
	lifecycle.Base

	js      jetstream.JetStream
	cfg     Config
	queue   chan Attempt
	dropped *prometheus.CounterVec

	warnMu   sync.Mutex
	warnedAt time.Time
}

// New returns a Log writing through js. It fails when a
// value of cfg is negative or the metric cannot be registered.
func New(js jetstream.JetStream, cfg Config) (*Log, error) {
	cfg.Stream = cmp.Or(cfg.Stream, wire.DefaultAttemptsStream)
	cfg.SubjectPrefix = cmp.Or(cfg.SubjectPrefix, wire.DefaultAttemptsPrefix)
	cfg.MaxAge = cmp.Or(cfg.MaxAge, DefaultMaxAge)
	cfg.MaxBytes = cmp.Or(cfg.MaxBytes, DefaultMaxBytes)
	cfg.Replicas = cmp.Or(cfg.Replicas, 1)
	cfg.Buffer = cmp.Or(cfg.Buffer, DefaultBuffer)
	cfg.Archetype = base.Default(cfg.Archetype)
	switch {
	case cfg.MaxAge < 0:
		return nil, fmt.Errorf("deliver: attempts log: MaxAge %s is negative", cfg.MaxAge)
	case cfg.MaxBytes < 0:
		return nil, fmt.Errorf("deliver: attempts log: MaxBytes %d is negative", cfg.MaxBytes)
	case cfg.Replicas < 0:
		return nil, fmt.Errorf("deliver: attempts log: Replicas %d is negative", cfg.Replicas)
	case cfg.Buffer < 0:
		return nil, fmt.Errorf("deliver: attempts log: Buffer %d is negative", cfg.Buffer)
	}
	if err := wire.ValidatePrefix(cfg.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("deliver: attempts log: SubjectPrefix: %w", err)
	}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_attempt_records_dropped_total",
		Help: "Attempt records not written to the attempts stream, by reason (full: the write queue was full; error: JetStream did not store it).",
	}, []string{"reason"})
	if cfg.Registerer != nil {
		var err error
		if dropped, err = promreg.Register(cfg.Registerer, dropped); err != nil {
			return nil, fmt.Errorf("deliver: attempts log: %w", err)
		}
	}
	return &Log{js: js, cfg: cfg, queue: make(chan Attempt, cfg.Buffer), dropped: dropped}, nil
}

// Stream returns the attempts stream's name.
func (l *Log) Stream() string { return l.cfg.Stream }

// Provision creates the attempts stream when it is missing (file storage,
// subjects <prefix>.>, MaxAge, MaxBytes with the oldest discarded first,
// Replicas) and leaves an existing one unchanged. It fails with
// ErrSubjects when the existing stream does not hold <prefix>.>,
// and with JetStream's error (wrapped) otherwise.
func (l *Log) Provision(ctx context.Context) error {
	s, err := l.js.Stream(ctx, l.cfg.Stream)
	if err == nil {
		subjects := s.CachedInfo().Config.Subjects
		if slices.Contains(subjects, ">") || slices.Contains(subjects, wire.All(l.cfg.SubjectPrefix)) {
			return nil
		}
		return fmt.Errorf("deliver: %w: JetStream stream %q has subjects %q, not %q", ErrSubjects, l.cfg.Stream, subjects, wire.All(l.cfg.SubjectPrefix))
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deliver: attempts stream %q: %w", l.cfg.Stream, err)
	}
	_, err = l.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        l.cfg.Stream,
		Description: "jsbridge delivery attempts, one record per attempt, for `consumer trace`",
		Subjects:    []string{wire.All(l.cfg.SubjectPrefix)},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      l.cfg.MaxAge,
		MaxBytes:    l.cfg.MaxBytes,
		Replicas:    l.cfg.Replicas,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("deliver: create attempts stream %q (subjects %s): %w", l.cfg.Stream, wire.All(l.cfg.SubjectPrefix), err)
	}
	return nil
}

// RecordAttempt queues a; when the queue is full it drops a and counts it.
// It never blocks.
func (l *Log) RecordAttempt(a Attempt) {
	a.Replica = l.cfg.Replica
	select {
	case l.queue <- a:
	default:
		l.dropped.WithLabelValues("full").Inc()
	}
}

// Start writes queued records in the background until Stop
// (lifecycle.Part); then it writes what is still queued (for at most a
// second) and waits for their PubAcks (at most pubAckWait). Stop it
// after the engine stopped, so a clean shutdown keeps the last
// attempts. It returns nil.
func (l *Log) Start(ctx context.Context) error {
	return l.Base.Start(ctx, nil, func(ctx context.Context) error { l.run(ctx); return nil })
}

// run writes queued records until ctx ends, then what is still queued.
//
// A run of records shares one PubAck (one PubAck each was about 4 % of
// the consumer's CPU): a record asks for one when no other came within
// lingerFor after it, or when ackEvery records went without one; the
// others are published without a reply subject. One connection's
// messages reach the stream in order, so the run's last PubAck comes
// after the others were stored. A refusal or a missing PubAck drops the
// run, counted whole: what refuses a record (no stream, a full store, no
// leader) refuses the records just before it too.
func (l *Log) run(ctx context.Context) {
	runs := &pendingRuns{n: map[*nats.Msg]int{}}
	// A JetStream context of its own: nats.go then times each PubAck out
	// and reports failures to fail itself, and no goroutine waits on each
	// record's future (that wait, a timer and a select per record, was
	// ~1 % of the consumer's CPU at full speed). Publishing does not use
	// the API prefix or domain of l.js, so none is needed here.
	pub, err := jetstream.New(l.js.Conn(),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { l.fail(runs.done(m), err) }),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { runs.done(m) }),
		jetstream.WithPublishAsyncTimeout(pubAckWait),
		jetstream.WithPublishAsyncMaxPending(attemptsPending))
	if err != nil {
		l.fail(1, err)
		<-ctx.Done()
		return
	}
	nc := l.js.Conn()
	unacked := 0 // records published without a PubAck since the last one asked for
	write := func(a Attempt, last bool) {
		data, ok := a.appendJSON(make([]byte, 0, 320))
		if !ok {
			var err error
			if data, err = json.Marshal(a); err != nil {
				l.fail(1, err)
				return
			}
		}
		msg := &nats.Msg{Subject: wire.AttemptSubject(l.cfg.SubjectPrefix, a.Subscription, a.EventID), Data: data}
		if !last && unacked+1 < ackEvery {
			if err := nc.PublishMsg(msg); err != nil {
				l.fail(1, err)
				return
			}
			unacked++
			return
		}
		runs.add(msg, unacked+1)
		unacked = 0
		// With attemptsPending PubAcks outstanding, wait for room as long
		// as a PubAck may take (the queue fills meanwhile, and drops).
		if _, err := pub.PublishMsgAsync(msg, jetstream.WithExpectStream(l.cfg.Stream), jetstream.WithStallWait(pubAckWait)); err != nil {
			l.fail(runs.done(msg), err)
		}
	}
	defer func() {
		t := l.cfg.Clock.NewTimer(pubAckWait)
		defer t.Stop()
		select {
		case <-pub.PublishAsyncComplete():
		case <-t.Chan():
		}
	}()
	// The newest record is held back for at most linger: when another
	// comes meanwhile, the held one is written without a PubAck; when none
	// does, the held one asks for the PubAck of the run.
	var held Attempt
	holding := false
	linger := l.cfg.Clock.NewTimer(time.Hour)
	linger.Stop()
	lingering := false
	for {
		select {
		case a := <-l.queue:
			if holding {
				write(held, false)
			}
			held, holding = a, true
			if !lingering && len(l.queue) == 0 {
				linger.Reset(lingerFor)
				lingering = true
			}
		case <-linger.Chan():
			lingering = false
			if holding {
				write(held, true)
				holding = false
			}
		case <-ctx.Done():
			linger.Stop()
			if holding {
				write(held, len(l.queue) == 0)
			}
			deadline := l.cfg.Clock.After(time.Second)
			for {
				select {
				case a := <-l.queue:
					write(a, len(l.queue) == 0)
				case <-deadline:
					if unacked > 0 {
						_ = nc.FlushTimeout(pubAckWait)
					}
					return
				default:
					return
				}
			}
		}
	}
}

// ackEvery bounds a run of records sharing one PubAck, and lingerFor how
// long the newest record waits for another to share it (see Run).
const (
	ackEvery  = 16
	lingerFor = 5 * time.Millisecond
)

// pendingRuns counts the records each PubAck asked for stands for, until
// it is answered.
type pendingRuns struct {
	mu sync.Mutex
	n  map[*nats.Msg]int
}

func (p *pendingRuns) add(m *nats.Msg, n int) {
	p.mu.Lock()
	p.n[m] = n
	p.mu.Unlock()
}

// done forgets m and returns the records it stood for (1 if unknown).
func (p *pendingRuns) done(m *nats.Msg) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.n[m]
	if !ok {
		return 1
	}
	delete(p.n, m)
	return n
}

// pubAckWait is how long a record's PubAck is awaited: after a failover
// many can be lost at once, and each is timed from its own publish (not
// one after the other, which held shutdown for minutes).
const pubAckWait = 5 * time.Second

// fail counts n records JetStream did not store and warns, at most once
// a minute. A store full for a while (JetStream refusing every write for
// lack of storage) thus drops records under reason "error" and says so
// once a minute; deliveries go on, and records are written again once
// space is freed.
func (l *Log) fail(n int, err error) {
	l.dropped.WithLabelValues("error").Add(float64(n))
	l.warnMu.Lock()
	defer l.warnMu.Unlock()
	now := l.cfg.Clock.Now()
	if !l.warnedAt.IsZero() && now.Sub(l.warnedAt) < time.Minute {
		return
	}
	l.warnedAt = now
	l.cfg.Logger.Warn("attempt record not written; `consumer trace` will miss it", "jetstream_stream", l.cfg.Stream, "error", err)
}
