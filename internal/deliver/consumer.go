// Package deliver is the consumer's engine: one durable pull consumer per
// subscription on the JetStream stream, each message POSTed as a signed
// webhook through the endpoint's circuit breaker, then acked, Nak'd with a
// delay or Term'd (and dead-lettered) by the webhook contract (docs/architecture.md, "Consumer: how a delivery ends").
package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Config configures a Consumer. The zero value works.
type Config struct {
	// Stream is the JetStream stream the durable consumers are created on.
	// Default "EVENTS".
	Stream string
	// HTTPClient sends the webhooks. Default: a keep-alive transport with
	// connect and TLS handshake timeouts and no proxy. Redirects are never
	// followed (a 3xx is a failure): deliver uses a copy of the client whose
	// CheckRedirect returns http.ErrUseLastResponse. For subscriptions
	// without AllowPrivate it also clones the Transport, which must then be
	// nil or an *http.Transport, and installs the dial-time address check
	// (ErrForbiddenAddress) and no proxy, and for subscriptions with TLS
	// files it clones it again with their certificates (so it must be nil or
	// an *http.Transport there too).
	HTTPClient *http.Client
	// Breakers holds the per-endpoint circuit breakers. Default: a Set with
	// breaker defaults, logging to Logger, metrics unregistered.
	Breakers *breaker.Set
	// Logger receives the delivery logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the delivery metrics
	// (jsbridge_consumer_deliveries_total{subscription,outcome,status_class},
	// jsbridge_consumer_attempt_duration_seconds{subscription},
	// jsbridge_consumer_in_flight{subscription}, and for ordered
	// subscriptions jsbridge_consumer_partitions_owned,
	// jsbridge_consumer_streams_parked, jsbridge_consumer_oldest_held_seconds
	// and jsbridge_consumer_handovers_total, all {subscription}). Default
	// nil: not registered.
	Registerer prometheus.Registerer
	// DeadLetters receives deliveries given up on, before they are Term'd
	// (a *deadletter.DLQ, provisioned). Default nil: they are logged at error level and
	// Term'd.
	DeadLetters deadletter.Writer
	// UserAgent is the User-Agent header. Default "jsbridge/<module version>".
	UserAgent string
	// Replicas is the replica count of the durable consumers created: 1 on
	// a standalone server, 3 on a cluster. Default 0: the JetStream
	// stream's count. JetStream refuses more than the stream's count (API
	// error 10126). A durable consumer that exists with another count
	// keeps it, with a warning (unordered.Runner.Provision, partitionconsumers.go).
	Replicas int
	// TracerProvider makes the attempt spans (attempt/trace.go: one per attempt,
	// continuing the trace in the message's traceparent header, which the
	// POST carries on). Default nil: otel's global tracer provider, a no-op
	// until the application installs an SDK.
	TracerProvider trace.TracerProvider
	// Attempts receives a record of the attempts AttemptsRecord keeps,
	// after each ended (an *attemptlog.Log writes them to JetStream for
	// `consumer trace`). Default nil: none kept.
	Attempts attemptlog.Recorder
	// AttemptsRecord says which attempts go to Attempts. Default (""):
	// attemptlog.ModeFailures, every attempt but a success on the first
	// one (counted in jsbridge_consumer_deliveries_total only);
	// attemptlog.ModeAll keeps them all. Another value is an error.
	AttemptsRecord attemptlog.Mode
	// Partitions is the number of partitions of the partitioned copy of
	// the JetStream stream that ordered subscriptions read (one durable
	// pull consumer per partition and subscription): the unit of
	// ownership among replicas, so at most Partitions replicas share an
	// ordered subscription's work. Default DefaultPartitions. The same for
	// every replica; changing it needs the copy deleted (docs/ordering.md).
	Partitions int
	// ReplicaID names this replica in partition leases, `consumer status`
	// and the Jsbridge-Replica webhook header: [A-Za-z0-9_-]+. Default:
	// "<hostname>-<pid>-<random>".
	ReplicaID string
	// LeaseTTL is how long a partition lease and a membership heartbeat
	// live unless renewed (renewed every LeaseTTL/4): a killed or frozen
	// replica's partitions are taken over after at most LeaseTTL (the new
	// owner resets the partition consumer to its ack floor rather than
	// wait AckWait for what the former owner left unacked).
	// Default DefaultLeaseTTL. Fixed when the lease bucket is created: a
	// replica finding the bucket with another TTL goes by the bucket's
	// (its keys expire after it) and logs a warning.
	LeaseTTL time.Duration
	// OrderStuckAfter bounds how long the head of an ordered
	// subscription's stream is retried in place while the receiver's
	// order gate refuses it (409 gap or in-progress, wire.HeaderOrder):
	// past it the head is dead-lettered and its stream parked, whatever
	// the subscription's OnDeadLetter (the "order-stuck" state, counted
	// by jsbridge_consumer_streams_order_stuck), until `consumer dlq
	// replay` or `consumer dlq skip`. Default DefaultOrderStuckAfter;
	// negative is an error.
	OrderStuckAfter time.Duration
	// Clock is the engine's time: lease renewals and deadlines, fence and
	// successor waits, parking timers and retry backoff. Default: the
	// wall clock; tests pass a clockwork fake. Not part of the consumer's
	// public Config.
	Clock clockwork.Clock
	// sendAck sends an ordered subscription's ack of an event once the
	// partition's delivered record holds it (delivered.go). Default nil:
	// the message's Ack. Internal tests replace it to play a replica
	// that froze between the record's write and the ack.
	sendAck func(jetstream.Msg) error
	// LocalBreakers keeps the circuit breakers to this replica. Default
	// false: the endpoints' breakers are shared with the other replicas
	// through the health bucket (package health), so one replica probes
	// an endpoint that is down while the others wait. Breakers must not
	// have been used before New when shared.
	LocalBreakers bool
	// Health configures automatic disabling (410 Gone, sustained failure)
	// and its operational webhook (package health). Zero fields take
	// their defaults.
	Health health.Config

	// fleet, set by a Fleet for its units, is the health state and
	// notifier they share (fleetshared.go); nil: the Consumer builds its
	// own and runs them.
	fleet *fleetShared
}

// healthLoadTimeout bounds Run's first read of the disabled
// subscriptions; past it Run starts with this replica's own state.
const healthLoadTimeout = 5 * time.Second

// Ordered delivery defaults.
const (
	DefaultPartitions = 16
	DefaultLeaseTTL   = 10 * time.Second
	// DefaultOrderStuckAfter is Config.OrderStuckAfter's default
	// (attempt.DefaultOrderStuckAfter, 5 minutes).
	DefaultOrderStuckAfter = attempt.DefaultOrderStuckAfter
)

// Consumer delivers the events of its subscriptions to their endpoints.
type Consumer struct {
	js        jetstream.JetStream
	cfg       Config
	log       *slog.Logger
	metrics   *metrics
	userAgent string
	runners   []*runner
	// ord is the ordered subscriptions' shared state (nil without any).
	ord *ordering
	// health is the subscriptions' disabled state; it announces a
	// disable.
	health *health.State
}

// runner is one subscription's pull loop.
type runner struct {
	// snd makes the subscription's attempts (package attempt).
	snd *attempt.Sender
	// What the runner reads of the subscription and its attempts: the
	// subscription with its defaults, the logger with its attributes, the
	// endpoint's breaker and its name.
	sub      subscription.Subscription
	log      *slog.Logger
	br       *breaker.Breaker
	endpoint string
	metrics  *metrics
	clock    clockwork.Clock
	health   *health.State

	// What the subscription needs of its Consumer, given once by New.
	js          jetstream.JetStream
	replicaID   string            // Config.ReplicaID
	deadLetters deadletter.Writer // nil: logged and Term'd

	// un delivers an unordered subscription (package unordered; nil for
	// an ordered one).
	un *unordered.Runner

	// This subscription's children of per-subscription metrics, resolved
	// once rather than on every delivery.
	redeliveries prometheus.Counter
	inFlight     prometheus.Gauge // the ordered path's POSTs holding a slot
	// ord is the ordered-delivery state of an ordered subscription (nil
	// for OrderingNone).
	ord *orderedRunner
}

// fillDefaults gives cfg's zero fields their defaults (New's and
// NewFleet's, filled once so that a Fleet's units share them): the events
// stream, a discarding logger, a breaker Set, the wall clock, the
// User-Agent and the ordering defaults. It fails for a negative Replicas
// or an invalid ordering setting.
func (cfg *Config) fillDefaults() error {
	if cfg.Stream == "" {
		cfg.Stream = wire.DefaultEventsStream
	}
	if cfg.Replicas < 0 {
		return fmt.Errorf("Config.Replicas %d is negative", cfg.Replicas)
	}
	record, err := attemptlog.ParseMode(string(cfg.AttemptsRecord))
	if err != nil {
		return fmt.Errorf("Config.AttemptsRecord: %w", err)
	}
	cfg.AttemptsRecord = record
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Breakers == nil {
		set, err := breaker.NewSet(breaker.Settings{}, cfg.Logger, nil)
		if err != nil {
			return err
		}
		cfg.Breakers = set
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = defaultUserAgent()
	}
	return orderingDefaults(cfg)
}

// New returns a Consumer for subs. It fails when js is nil, no subscription
// is given, a subscription is invalid (ErrInvalidSubscription), two share a
// name, or the metrics cannot be registered.
func New(js jetstream.JetStream, cfg Config, subs ...subscription.Subscription) (*Consumer, error) {
	if js == nil {
		return nil, errors.New("deliver: new consumer: jetstream.JetStream is nil")
	}
	if len(subs) == 0 {
		return nil, fmt.Errorf("deliver: new consumer: %w: no subscriptions given", subscription.ErrInvalidSubscription)
	}
	if err := cfg.fillDefaults(); err != nil {
		return nil, fmt.Errorf("deliver: new consumer: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("deliver: new consumer: %w", err)
	}
	open := egress.NoRedirects(cfg.HTTPClient)
	var safe *http.Client
	c := &Consumer{
		js:        js,
		cfg:       cfg,
		log:       cfg.Logger,
		metrics:   m,
		userAgent: cfg.UserAgent,
	}
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name
	}
	if cfg.fleet != nil {
		c.health = cfg.fleet.health
	} else if c.health, err = newHealth(js, cfg, names); err != nil {
		return nil, fmt.Errorf("deliver: new consumer: %w", err)
	}
	rateGauge, err := attempt.NewRateGauge(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("deliver: new consumer: %w", err)
	}
	seen := make(map[string]bool, len(subs))
	for _, s := range subs {
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("deliver: new consumer: %w", err)
		}
		s = s.WithDefaults()
		if seen[s.Name] {
			return nil, fmt.Errorf("deliver: new consumer: %w %q: Name: used by two subscriptions", subscription.ErrInvalidSubscription, s.Name)
		}
		seen[s.Name] = true
		signer, err := webhook.NewSigner(s.Scheme, s.Secrets...)
		if err != nil {
			return nil, fmt.Errorf("deliver: new consumer: subscription %q: %w", s.Name, err)
		}
		client, err := subscription.Client(open, &safe, s)
		if err != nil {
			return nil, fmt.Errorf("deliver: new consumer: %w", err)
		}
		br := cfg.Breakers.Breaker(s.URL)
		snd, err := attempt.New(attempt.Config{Subscription: s, Signer: signer, Client: client, UserAgent: cfg.UserAgent}, attempt.Deps{
			Breaker:  br,
			Health:   c.health,
			Clock:    cfg.Clock,
			Logger:   cfg.Logger,
			Tracer:   tracing.Tracer(cfg.TracerProvider),
			Metrics:  attempt.Metrics{Deliveries: c.metrics.deliveries, Duration: c.metrics.duration.WithLabelValues(s.Name), Rate: rateGauge.WithLabelValues(s.Name)},
			Attempts: cfg.Attempts,
			Record:   cfg.AttemptsRecord,
		})
		if err != nil {
			return nil, fmt.Errorf("deliver: new consumer: %w %q: %w", subscription.ErrInvalidSubscription, s.Name, err)
		}
		r := &runner{
			snd: snd, sub: s, log: snd.Logger(), br: br, endpoint: snd.Endpoint(), metrics: c.metrics, clock: cfg.Clock, health: c.health,
			js: js, replicaID: cfg.ReplicaID, deadLetters: cfg.DeadLetters,
			redeliveries: c.metrics.redeliveries.WithLabelValues(s.Name),
			inFlight:     c.metrics.inFlight.WithLabelValues(s.Name),
		}
		if !s.Ordered() {
			if r.un, err = newUnordered(js, cfg, r); err != nil {
				return nil, fmt.Errorf("deliver: new consumer: %w", err)
			}
		}
		c.runners = append(c.runners, r)
	}
	c.ord = newOrdering(c)
	return c, nil
}

// newUnordered builds the unordered delivery of r's subscription, with
// cfg's stream and replicas and, in a Fleet, its census and unit count.
func newUnordered(js jetstream.JetStream, cfg Config, r *runner) (*unordered.Runner, error) {
	d := unordered.Deps{
		JetStream: js, Sender: r.snd, Breaker: r.br, Health: r.health, DeadLetters: cfg.DeadLetters,
		Clock: cfg.Clock, Logger: r.log,
		Metrics: unordered.Metrics{
			Deliveries: r.metrics.deliveries, InFlight: r.metrics.inFlight.WithLabelValues(r.sub.Name), Redeliveries: r.redeliveries,
			DeadLetters: r.metrics.deadLetters.WithLabelValues(r.sub.Name),
		},
	}
	if cfg.fleet != nil {
		d.Census, d.Units = cfg.fleet.census, cfg.fleet.unitCount
	}
	return unordered.New(unordered.Config{Subscription: r.sub, Stream: cfg.Stream, Replicas: cfg.Replicas}, d)
}

func defaultUserAgent() string {
	v := "dev"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return "jsbridge/" + v
}

// Provision creates or updates each subscription's durable pull consumer
// on the JetStream stream (an existing one keeps its replica count, see
// Config.Replicas) and, when a subscription is ordered, the partitioned
// copy of the stream, the lease and park buckets and the partition
// consumers (ErrPartitionsChanged, ErrEventsRecreated and
// ErrInvalidSubscription there are not fixed by waiting), once, and
// returns the first error, wrapped with the subscription's and the
// stream's names (jetstream.ErrStreamNotFound
// while the stream does not exist yet). Calling it before Run is optional:
// it lets a binary wait for the stream, with its own timeout and logs,
// before it starts; Run creates what Provision did not. Do not call it
// while Run runs.
func (c *Consumer) Provision(ctx context.Context) error {
	if c.ord != nil {
		if err := c.ord.provision(ctx); err != nil {
			return err
		}
	}
	for _, r := range c.runners {
		if r.sub.Ordered() {
			continue
		}
		if err := r.un.Provision(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Run delivers until ctx ends; then it stops pulling, lets the deliveries
// in flight finish (each bounded by its Timeout), Naks messages pulled but
// not started, and returns nil. It creates each subscription's durable
// pull consumer first (unless Provision did). Ordered subscriptions
// (Subscription.Ordering) share partitions with the other replicas and,
// when ctx ends, release them (their in-flight deliveries finish, the rest
// goes back to JetStream for the next owner; docs/ordering.md). Nothing JetStream answers
// ends it: a stream that does not exist yet, a durable consumer deleted
// while it runs, a timeout, no responders, a leader change or a reconnect
// are logged at warn level and retried after a pause growing from 0.5 s to
// 15 s (±20 %), for each subscription on its own. Call Run once.
func (c *Consumer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if c.cfg.fleet == nil { // a Fleet runs its units' shared health
		lctx, cancel := context.WithTimeout(ctx, healthLoadTimeout)
		c.health.Load(lctx)
		cancel()
		defer c.health.Wait()
		wg.Go(func() { c.health.Run(ctx) })
	}
	if c.ord != nil {
		wg.Go(func() { c.ord.run(ctx) })
	}
	for _, r := range c.runners {
		if r.sub.Ordered() {
			continue
		}
		wg.Go(func() { r.un.Run(ctx) })
	}
	wg.Wait()
	return nil
}

// Replay POSTs each dead letter once more to its subscription's endpoint,
// signed with the subscription's current secrets and with the same
// Idempotency-Key (the event id), outside the circuit breaker, and removes
// it from q once the endpoint answers 2xx
// (jsbridge_consumer_dead_letters_replayed_total counts those); when it
// was the head of a parked stream (an ordered subscription), the stream is
// unparked (deadletter.Unpark) and its held events follow, in order. A dead
// letter that fails again stays where it is. The subscriptions are matched
// by name; a dead letter of a subscription c does not have gets an error
// wrapping ErrUnknownSubscription. Replay returns one result per letter, in
// order; it stops early only when ctx ends.
func (c *Consumer) Replay(ctx context.Context, q *deadletter.DLQ, letters []deadletter.Stored) []ReplayResult {
	byName := make(map[string]*runner, len(c.runners))
	for _, r := range c.runners {
		byName[r.sub.Name] = r
	}
	out := make([]ReplayResult, 0, len(letters))
	for _, dl := range letters {
		if ctx.Err() != nil {
			break
		}
		res := ReplayResult{Letter: dl}
		r, ok := byName[dl.Subscription]
		switch {
		case !ok:
			res.Err = fmt.Errorf("dead letter %d: %w: %q", dl.Seq, ErrUnknownSubscription, dl.Subscription)
		case dl.EventID == "":
			res.Err = fmt.Errorf("dead letter %d has no event id: it cannot be replayed", dl.Seq)
		default:
			res = replay(ctx, r, r.js, q, c.withPrevious(ctx, r, dl))
		}
		out = append(out, res)
	}
	return out
}
