// Package consumer runs the jsbridge consumer inside a Go application: the
// circuit breakers, the dead-letter stream, the attempts record and the
// delivery engine assembled, as `consumer run` assembles them, behind New,
// Start, Stop and Ready. It is the consumer's only public package: its
// Config, the dead-letter and parked-stream operations (DeadLetters,
// Consumer.Replay), replay by time (Consumer.ReplayWindow), the status reader (ReadStatus) and the trace reader
// (TraceEvent); the engine lives under internal/.
//
//	c, err := consumer.New(js, consumer.Config{Subscriptions: subs})
//	if err != nil { ... }
//	if err := c.Start(ctx); err != nil { ... }
//	defer c.Stop(context.Background())
//
// Every event is POSTed to each endpoint whose subscription takes it,
// signed, with Idempotency-Key = event id, through the endpoint's circuit
// breaker, then settled, retried with backoff or dead-lettered
// (docs/architecture.md, "Consumer: how a delivery ends"), by the shared
// engine: one reader of the events stream per process, partitions leased
// among the processes, positions in the jsbridge_positions bucket. A
// deployment that ran the durables engine of earlier releases moves with
// `consumer migrate` first (Provision refuses it until then:
// ErrNotMigrated, ErrNoAllowDirect). Consumers in several processes
// (in-process ones and `consumer run`) share the work of the same
// subscription names.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/startup"
)

// ErrAlreadyStarted is returned by Start or Run on a Consumer that runs or
// ran already: a Consumer delivers once; make a new one to start again.
var ErrAlreadyStarted = errors.New("consumer: already started")

// ErrStartupTimeout is wrapped by Provision (and Start) when
// Config.StartupTimeout passed while it still waited; the message names
// what was missing and its last error.
var ErrStartupTimeout = startup.ErrTimeout

// Consumer delivers the events of its subscriptions to their endpoints.
// Its methods are safe for concurrent use.
type Consumer struct {
	cfg Config
	// arch is the engine's archetype (its clock, Config.Logger,
	// Config.ReplicaID), made once by New and handed to every part.
	arch     *base.Archetype
	js       jetstream.JetStream
	dlq      *deadletter.DLQ
	letters  *DeadLetters
	attempts *attemptlog.Log // nil without Config.Attempts
	engine   *sharedEngine   // what delivers
	// live is the engine when the subscriptions come from
	// Config.SubscriptionStore (nil otherwise): watch applies the
	// bucket's changes to it.
	live liveSubscriptions

	life *lifecycle.Runner // Start / Run / Stop, as bridge's

	mu          sync.Mutex
	waiter      *startup.Waiter // the Waiter of the running Provision; nil before
	provisioned bool
}

// New assembles a consumer on js without touching it: it checks cfg
// (Validate; an error wrapping ErrInvalidConfig names the field and the
// value), fills its defaults, and registers the delivery, breaker and
// attempts-record metrics on cfg.Registerer (an error when they are
// registered there already). js must not be nil.
func New(js jetstream.JetStream, cfg Config) (*Consumer, error) {
	return newConsumer(js, cfg, nil)
}

// newConsumer is New on clock (nil: the real one), the engine's only
// clock: tests in this package give a fake one.
func newConsumer(js jetstream.JetStream, cfg Config, clock clockwork.Clock) (*Consumer, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream is nil", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	for _, s := range cfg.Subscriptions {
		if s.AckWait != 0 {
			cfg.Logger.Warn(subscription.AckWaitIgnored, slog.String("subscription", s.Name), slog.Duration("ack_wait", s.AckWait))
		}
	}
	if cfg.ReplicaID == "" {
		// One name for this process in leases, status and attempt
		// records, so consumer status and consumer trace agree:
		// "<hostname>-<pid>-<random>", unique per process even when host
		// names and pids repeat (containers).
		cfg.ReplicaID = base.ReplicaID()
	}
	arch := base.New(clock, cfg.Logger, cfg.ReplicaID)
	breakers, err := breaker.NewSet(cfg.Breaker, cfg.Logger, cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	dlq := deadletter.New(js, deadletter.Config{Archetype: arch, Stream: cfg.DLQStream, Replicas: cfg.Replicas, EventsStream: cfg.Stream})
	c := &Consumer{cfg: cfg, arch: arch, js: js, dlq: dlq, letters: &DeadLetters{js: js, q: dlq}, life: lifecycle.New(ErrAlreadyStarted)}
	var (
		records attemptlog.Recorder // nil without Config.Attempts
		record  attemptlog.Mode
	)
	if a := cfg.Attempts; a != nil {
		c.attempts, err = attemptlog.New(js, attemptlog.Config{
			Archetype: arch.WithReplica(a.Replica), Stream: a.Stream, MaxAge: a.MaxAge, MaxBytes: a.MaxBytes, Replicas: cfg.Replicas,
			Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
		records, record = c.attempts, a.Record
	}
	if cfg.SubscriptionStore != nil && cfg.SubscriptionStore.s == nil {
		return nil, fmt.Errorf("%w: SubscriptionStore: not opened (make it with OpenSubscriptionStore)", ErrInvalidConfig)
	}
	var subs []subscription.Subscription
	if cfg.SubscriptionStore == nil {
		subs = engineSubscriptions(cfg.Subscriptions)
	}
	se, err := newSharedEngine(arch, js, cfg, sharedDeps{breakers: breakers, letters: dlq, attempts: records, record: record}, subs)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c.engine = se
	if cfg.SubscriptionStore != nil {
		c.live, se.loaded = se, make(chan struct{})
	}
	return c, nil
}

// Config returns the consumer's configuration with its defaults filled in
// (the subscriptions as given: deliver fills theirs).
func (c *Consumer) Config() Config { return c.cfg }

// DeadLetters returns the dead-letter stream the consumer writes to, for
// listing, skipping and purging dead letters (replay them with Replay).
func (c *Consumer) DeadLetters() *DeadLetters { return c.letters }

// Provision waits for what delivering needs and creates what is missing:
// first the attempts stream when Config.Attempts is set (an existing one
// that does not hold the attempts subjects fails at once with
// ErrAttemptsSubjects), then the dead-letter stream (created when missing;
// an existing one that does not hold the dead-letter subjects fails at
// once with ErrDLQSubjects), then the engine's: it waits for the bridge
// to create Config.Stream, and refuses at once a deployment the
// durables engine of an earlier release ran and `consumer migrate` has
// not moved (ErrNoAllowDirect, ErrNotMigrated; docs/operations.md,
// "Upgrading from a release that ran the durables engine"). A
// dependency that is not there yet (no responders, a timeout, a stream not
// found, a leader election) is retried with backoff (0.5 s doubling to
// 15 s, ±20 %), one warning per attempt naming what is missing, while
// Ready says what is waited for. It gives up on what waiting cannot fix
// (bad credentials or configuration, per JetStream's answer), when
// Config.StartupTimeout passes (ErrStartupTimeout) or when ctx ends (an
// error wrapping ctx's). Start calls it; call it yourself before Run to
// wait with your own context. Do not call it while the consumer runs.
func (c *Consumer) Provision(ctx context.Context) error {
	// `consumer run` hands its Waiter down in ctx: one deadline and one
	// /readyz state for its NATS connection and these steps.
	w := startup.WaiterFrom(ctx)
	if w == nil {
		w = startup.New(c.cfg.Logger, c.cfg.StartupTimeout)
	}
	c.mu.Lock()
	c.waiter = w
	c.mu.Unlock()
	if c.attempts != nil {
		err := w.For(ctx, "JetStream attempts stream "+c.attempts.Stream(), func(ctx context.Context) error {
			err := c.attempts.Provision(ctx)
			if errors.Is(err, attemptlog.ErrSubjects) {
				return startup.Permanent(err)
			}
			return startup.JetStreamErr(err)
		})
		if err != nil {
			return err
		}
	}
	err := w.For(ctx, "JetStream dead-letter stream "+c.cfg.DLQStream, func(ctx context.Context) error {
		err := c.dlq.Provision(ctx)
		if errors.Is(err, deadletter.ErrSubjects) {
			return startup.Permanent(err)
		}
		return startup.JetStreamErr(err)
	})
	if err != nil {
		return err
	}
	// The events stream is the bridge's: a consumer started first waits
	// for it here.
	err = w.For(ctx, "JetStream stream "+c.cfg.Stream, func(ctx context.Context) error {
		err := c.engine.Provision(ctx)
		if errors.Is(err, subscription.ErrInvalidSubscription) || errors.Is(err, ErrNoAllowDirect) || errors.Is(err, ErrNotMigrated) ||
			errors.Is(err, ErrPartitionsChanged) {
			return startup.Permanent(err)
		}
		return startup.JetStreamErr(err)
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.provisioned = true
	c.mu.Unlock()
	w.Ready()
	return nil
}

// Start provisions (Provision: it waits for the dead-letter stream and the
// events stream, up to Config.StartupTimeout, and returns its error),
// then delivers in the background until Stop is called or ctx ends (either
// is a graceful stop, as on SIGTERM). A Stop while Start still waits ends
// the waiting: Start then returns an error wrapping context.Canceled. After
// a failed Start, Start may be called again; a second Start after a
// successful one returns ErrAlreadyStarted.
func (c *Consumer) Start(ctx context.Context) error {
	return c.life.Start(ctx, c.Provision, func(ctx context.Context) error {
		_ = c.deliver(ctx) // always nil: the engine retries what fails
		return nil
	})
}

// Run delivers in the foreground until ctx ends or Stop is called, then
// stops gracefully as Stop does and returns nil. It provisions first
// unless Provision succeeded already, and returns Provision's error, or
// nil when ctx ended or Stop was called while it waited (a stop while
// starting is a clean stop); after such an error Run may be called again.
// A Consumer runs once: Run after Start, or a second Run, returns
// ErrAlreadyStarted.
func (c *Consumer) Run(ctx context.Context) error {
	err := c.life.Run(ctx, func(ctx context.Context) error {
		c.mu.Lock()
		provisioned := c.provisioned
		c.mu.Unlock()
		if provisioned {
			return nil
		}
		return c.Provision(ctx)
	}, c.deliver)
	if err != nil && !errors.Is(err, ErrAlreadyStarted) && (ctx.Err() != nil || errors.Is(err, context.Canceled)) {
		return nil // stopped while provisioning
	}
	return err
}

// deliver runs the engine until ctx ends, and the attempts record until
// the engine stopped (the records of the deliveries that finish during a
// graceful stop are written too).
func (c *Consumer) deliver(ctx context.Context) error {
	var parts []lifecycle.Part // stopped in reverse once the engine stopped
	if c.attempts != nil {
		parts = append(parts, c.attempts)
	}
	if c.live != nil {
		parts = append(parts, lifecycle.NewFunc(func(wctx context.Context) error {
			wctx, cancel := context.WithCancel(wctx)
			defer cancel()
			defer context.AfterFunc(ctx, cancel)() // the watch ends with ctx, not with the engine
			c.watch(wctx)
			return nil
		}))
	}
	if err := lifecycle.StartAll(ctx, parts...); err != nil {
		return err
	}
	defer lifecycle.StopAll(parts...)
	return c.engine.Run(ctx)
}

// Stop stops the deliveries started by Start with the same guarantees as
// SIGTERM to `consumer run`: nothing new is started, the POSTs in flight
// finish (each bounded by its subscription's Timeout) and are settled,
// retried or dead-lettered by their outcome, and every partition is
// released with its position committed so another replica takes it over
// at once. It returns nil when
// the consumer has stopped, or ctx's error when ctx ends first (it then
// finishes stopping in the background). Stop while Start waits ends the
// waiting. Stop before Start, or again, is harmless.
func (c *Consumer) Stop(ctx context.Context) error {
	if err := c.life.Stop(ctx); err != nil {
		return fmt.Errorf("stop consumer: %w", err)
	}
	return nil
}

// Ready reports whether the consumer can deliver: nil once Provision
// succeeded while the events stream and the dead-letter stream exist;
// else an error saying what is missing (while Provision waits, what it
// waits for and its last error). Wire it into the application's readiness
// endpoint.
func (c *Consumer) Ready(ctx context.Context) error {
	c.mu.Lock()
	w, provisioned := c.waiter, c.provisioned
	c.mu.Unlock()
	switch {
	case w == nil:
		return errors.New("not provisioned yet")
	case !provisioned:
		if err := w.Check(ctx); err != nil {
			return err
		}
		return errors.New("provisioning")
	}
	for _, s := range []string{c.cfg.Stream, c.cfg.DLQStream} {
		if _, err := c.js.Stream(ctx, s); err != nil {
			return fmt.Errorf("jetstream stream %s: %w", s, err)
		}
	}
	return nil
}

// Replay POSTs each dead letter once more to its subscription's endpoint,
// signed with the subscription's current secrets and with the same
// Idempotency-Key (the event id), outside the circuit breaker, and removes
// it from the dead-letter stream once the endpoint answers 2xx
// (jsbridge_consumer_dead_letters_replayed_total counts those); when it
// was the head of a parked stream (an ordered subscription), the stream is
// unparked and its held events follow, in order (by a request in the
// positions bucket that the owner of the stream's partition applies). A
// dead letter that fails
// again stays where it is. The subscriptions are matched by name; a dead
// letter of a subscription c does not have gets an error wrapping
// ErrUnknownSubscription. Replay returns one result per letter, in order;
// it stops early only when ctx ends. It needs no Start.
func (c *Consumer) Replay(ctx context.Context, letters []DeadLetter) []ReplayResult {
	res := c.engine.Replay(ctx, c.dlq, toStored(letters))
	out := make([]ReplayResult, len(res))
	for i, r := range res {
		out[i] = ReplayResult{Letter: DeadLetter(r.Letter), Delivered: r.Delivered, Status: r.Status, Err: r.Err}
	}
	return out
}

// ReplayWindow re-delivers what the events stream holds in window w to
// the endpoint of the subscription named subscription, as a delivery
// sends it (body, signature with the current secrets, Idempotency-Key =
// event id, so an idempotent receiver drops what it has seen), in the
// events stream's order (each source stream in version order), one event
// at a time, outside the circuit breaker. It reads with direct gets and
// touches no position. A POST not answered 2xx stops it at
// that event (WindowResult.Failed; nothing after it is sent): the same
// call with Since = Failed.Time resumes there. Errors: ErrInvalidWindow,
// ErrUnknownSubscription (wrapped) for a name c was not given,
// JetStream's errors reading the stream, ctx's when it ends first (each
// with the result so far). It needs no Start (docs/operations.md,
// "Replay a time window").
func (c *Consumer) ReplayWindow(ctx context.Context, subscription string, w Window) (WindowResult, error) {
	r, err := c.engine.replayWindow(ctx, subscription, w.engine())
	return fromEngine(r), err
}
