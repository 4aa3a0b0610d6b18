// Package unordered delivers a subscription with ordering none: one
// durable pull consumer per subscription on the events stream, shared by
// every consumer replica, pulled while the endpoint's circuit breaker is
// closed (one probe message at a time while it is half-open, nothing while
// it is open or the subscription is disabled); each message pulled is
// delivered at once, whatever its source stream, up to MaxInFlight at a
// time in the process (and MaxAckPending across the replicas), and each
// attempt is settled here: ack, Nak with the delay, or dead letter and
// Term.
//
// New builds a subscription's Runner from its Config and the dependencies
// it takes from the engine (Deps: the attempts, the breaker, the health, as
// interfaces this package owns); Provision creates its durable consumer,
// Run delivers until its context ends. The package knows nothing of
// ordered delivery.
package unordered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// Config is one unordered subscription's delivery.
type Config struct {
	// Subscription is the subscription, validated and with its defaults
	// (subscription.Subscription.WithDefaults): its name (the durable
	// consumer's), filters, start, AckWait, MaxInFlight and MaxAckPending.
	Subscription subscription.Subscription
	// Stream is the JetStream stream the durable consumer is created on
	// (required).
	Stream string
	// Replicas is the replica count a new durable consumer is created with
	// (0: the stream's); an existing one keeps its own, with a warning.
	Replicas int
}

// Sender makes the subscription's attempts; *attempt.Sender fills it.
type Sender interface {
	// Gate waits until an attempt may start (the throttle, the
	// subscription enabled), calling hold while it waits; it returns the
	// attempt's generation, or ctx's error.
	Gate(ctx context.Context, hold func() (stop func())) (gen uint64, err error)
	// KeepAlive calls inProgress every AckWait/2 until stop is called.
	KeepAlive(id string, inProgress func() error) (stop func())
	// Attempt makes attempt n of msg and returns what to do with it.
	Attempt(ctx context.Context, msg jetstream.Msg, n int, c attempt.Call) attempt.Settlement
	// End ends the attempt's span and record.
	End(tr *attempt.Trace)
	// Count counts a delivery by outcome, status class and status.
	Count(outcome, class string, status int)
	// RetryDelay is the delay before the retry after attempt n (the
	// endpoint's Retry-After when positive).
	RetryDelay(n int, retryAfter time.Duration) time.Duration
	// Rate is the throttle's rate, in requests per second (for logs).
	Rate() float64
}

// Breaker is the endpoint's circuit breaker as the pull reads it;
// *breaker.Breaker fills it.
type Breaker interface {
	// Wait waits until the breaker is not open, or for ctx.
	Wait(ctx context.Context) error
	// State is the breaker's state.
	State() breaker.State
	// Changed is closed at the breaker's next change of state.
	Changed() <-chan struct{}
	// OpenTimeout is how long the breaker stays open.
	OpenTimeout() time.Duration
}

// Health is the subscriptions' disabled state as the pull reads it;
// *health.State fills it.
type Health interface {
	// WaitEnabled waits until the subscription is enabled, or for ctx.
	WaitEnabled(ctx context.Context, name string) error
	// IsDisabled reports whether the subscription is disabled.
	IsDisabled(name string) bool
	// Changes is closed at the next change of any subscription's state.
	Changes() <-chan struct{}
}

// Metrics are the subscription's children of the engine's collectors.
type Metrics struct {
	// Deliveries is jsbridge_consumer_deliveries_total by subscription,
	// outcome and status_class (required).
	Deliveries *prometheus.CounterVec
	// InFlight is the subscription's jsbridge_consumer_in_flight (required).
	InFlight prometheus.Gauge
	// Redeliveries is the subscription's
	// jsbridge_consumer_redeliveries_total (required).
	Redeliveries prometheus.Counter
	// DeadLetters is the subscription's jsbridge_consumer_dead_letters_total
	// (required).
	DeadLetters prometheus.Counter
}

// Deps are what a Runner takes from the engine.
type Deps struct {
	// JetStream is the connection's JetStream (required).
	JetStream jetstream.JetStream
	// Sender makes the attempts (required).
	Sender Sender
	// Breaker is the endpoint's circuit breaker (required).
	Breaker Breaker
	// Health is the subscriptions' disabled state (required).
	Health Health
	// DeadLetters receives the deliveries given up on, before they are
	// Term'd (nil: they are logged at error level and Term'd).
	DeadLetters deadletter.Writer
	// Clock is the engine's clock: the pauses between failed pulls and
	// the checks of the durable consumer (nil: the wall clock).
	Clock clockwork.Clock
	// Logger logs the subscription's deliveries, with its attributes
	// (nil: discarded).
	Logger *slog.Logger
	// Metrics are the collectors counted in.
	Metrics Metrics
	// Census, in a Fleet, tells whether the durable consumer still exists
	// from one listing for all its units (nil: the Runner asks JetStream
	// itself every 10 s).
	Census *Census
	// Units is the number of subscriptions the Fleet runs, which stretches
	// the pull's heartbeat (pulltiming.go); nil: not in a Fleet.
	Units func() int
}

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("unordered: invalid config")

// Runner is one unordered subscription's pull loop and settler.
type Runner struct {
	snd         Sender
	sub         subscription.Subscription
	log         *slog.Logger
	br          Breaker
	endpoint    string
	clock       clockwork.Clock
	health      Health
	js          jetstream.JetStream
	stream      string
	replicas    int
	deadLetters deadletter.Writer // nil: logged and Term'd
	census      *Census
	units       func() int

	deliveries   *prometheus.CounterVec
	inFlight     prometheus.Gauge
	redeliveries prometheus.Counter
	deadLettered prometheus.Counter

	// workers run the deliveries on reused goroutines.
	workers pull.Workers
	// cons is the durable consumer Provision created; nil until then (Run
	// creates it).
	cons jetstream.Consumer
}

// New returns the Runner of cfg.Subscription. It fails, wrapping
// ErrInvalidConfig, when the stream or a required dependency is missing,
// or MaxInFlight is below 1 (a subscription without its defaults).
func New(cfg Config, deps Deps) (*Runner, error) {
	name := cfg.Subscription.Name
	missing := ""
	switch {
	case cfg.Stream == "":
		missing = "Config.Stream"
	case deps.JetStream == nil:
		missing = "Deps.JetStream"
	case deps.Sender == nil:
		missing = "Deps.Sender"
	case deps.Breaker == nil:
		missing = "Deps.Breaker"
	case deps.Health == nil:
		missing = "Deps.Health"
	case deps.Metrics.Deliveries == nil, deps.Metrics.InFlight == nil, deps.Metrics.Redeliveries == nil, deps.Metrics.DeadLetters == nil:
		missing = "Deps.Metrics"
	}
	if missing != "" {
		return nil, fmt.Errorf("%w: subscription %q: %s is missing", ErrInvalidConfig, name, missing)
	}
	if n := cfg.Subscription.MaxInFlight; n < 1 {
		return nil, fmt.Errorf("%w: subscription %q: Subscription.MaxInFlight %d: want at least 1 (WithDefaults gives %d)", ErrInvalidConfig, name, n, subscription.DefaultMaxInFlight)
	}
	if deps.Clock == nil {
		deps.Clock = clockwork.NewRealClock()
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Units == nil {
		deps.Units = func() int { return 0 }
	}
	return &Runner{
		snd: deps.Sender, sub: cfg.Subscription, log: deps.Logger, br: deps.Breaker, endpoint: breaker.Endpoint(cfg.Subscription.URL),
		clock: deps.Clock, health: deps.Health, js: deps.JetStream, stream: cfg.Stream, replicas: cfg.Replicas,
		deadLetters: deps.DeadLetters, census: deps.Census, units: deps.Units,
		deliveries: deps.Metrics.Deliveries, inFlight: deps.Metrics.InFlight, redeliveries: deps.Metrics.Redeliveries,
		deadLettered: deps.Metrics.DeadLetters,
	}, nil
}

// Provision creates or updates the durable consumer (with the
// subscription's start when new; an existing one keeps its start and
// position, and subscription.ErrStartChanged says when the subscription
// asks for another), for Run to use. Calling it is optional: Run creates
// what Provision did not. Do not call it while Run runs.
func (r *Runner) Provision(ctx context.Context) error {
	cons, err := r.createConsumer(ctx)
	if err != nil {
		return err
	}
	r.cons = cons
	return nil
}

// sleep waits d on clock, or until ctx ends, whichever comes first.
func sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) {
	if d <= 0 {
		return
	}
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.Chan():
	}
}
