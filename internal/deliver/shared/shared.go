// Package shared is what one consumer replica runs for the shared engine
// (docs/design/next-engine.md, sections 1–3; the staged plan's stage 6):
// it joins the four rooms of the next engine. The replica's partitions
// are leased by an owner.Owner; each partition it gains has its record
// claimed (position.Claim, with the claim's epoch) and committed
// (position.Partition.Run), and a fan-out (fanout.Partition) that sends
// its events to the subscriptions. One dispatch loop goroutine owns the
// replica's one read of the events stream (reader.Reader): it hands each
// event to its partition's fan-out, runs the partitions' cursors
// (fanout.Partition.CatchUp) between events, and takes and releases
// partitions as the owner gains and releases them.
//
// The adapters of fanout's interfaces: the Sender (attempt.Claim, one
// per claim) makes each attempt through internal/deliver/attempt behind
// the claim's lease fence and the subscription's health and throttle, and stores an event given up on
// in the dead-letter stream (Deps.DeadLetters) before it settles it;
// the Chain (here) looks a stream's predecessor up on the events
// stream (deadletter.Predecessor: jsapi.LastBefore, confirmed by the
// stream's leader, stepped over the dead-lettered versions recorded in
// the positions bucket); the cursors read through fanout's
// cursor.Reader. The
// subscriptions' health (health.go) stops a disabled subscription on
// every partition the replica owns.
//
// An endpoint's open circuit breaker gives its subscriptions
// fanout.StateBreaker cursors (breakers.go).
package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/shared/metrics"
	"github.com/jsbridge/jsbridge/internal/deliver/shared/seqtime"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrInvalidConfig is wrapped by New for a Config or Deps field it cannot
// use; the message names the field and the value.
var ErrInvalidConfig = errors.New("shared: invalid config")

// Config is one replica of the shared engine.
type Config struct {
	// Archetype is the engine's clock (the leases, the commits' linger,
	// the retry pauses), logger and replica id ([A-Za-z0-9_-]+: its
	// lease keys' value, its records' owner), handed to every part the
	// replica makes. Default base.Default.
	*base.Archetype
	// Partitions is P, the number of partitions; it must agree on every
	// replica. Default 16; 1 to owner.MaxPartitions.
	Partitions int
	// Stream and Prefix are the events stream and its subject prefix.
	// Defaults wire.DefaultEventsStream and wire.DefaultEventsPrefix.
	Stream string
	Prefix string
	// LeaseBucket is the lease bucket (default wire.DefaultLeaseBucket),
	// LeaseTTL its key TTL when created (default owner.DefaultLeaseTTL).
	LeaseBucket string
	LeaseTTL    time.Duration
	// PositionsBucket holds the records, cursors and the epoch counter.
	// Default position.DefaultBucket.
	PositionsBucket string
	// Replicas is the lease and positions buckets' replica count when
	// they are created (0: the server's default, 1).
	Replicas int
	// Linger is the records' commit linger (position.Config.Linger).
	// Default position.DefaultLinger.
	Linger time.Duration
	// UserAgent is every webhook's User-Agent. Default "jsbridge".
	UserAgent string
	// OrderStuckAfter bounds how long a receiver's order gate may refuse
	// the head of an ordered subscription's stream (409 gap or
	// in-progress, without another answer between) before it is
	// dead-lettered and its stream parked, whatever OnDeadLetter says
	// (counted by attempt.Claim). Default attempt.DefaultOrderStuckAfter (5
	// minutes); negative: never.
	OrderStuckAfter time.Duration
	// Health is the automatic disabling (the failure streak rule) and its
	// operational webhook, for the health.State the replica makes when
	// Deps.Health is nil; zero fields take health.Config's defaults.
	Health health.Config
}

// Deps are what a Replica uses.
type Deps struct {
	// JetStream is the replica's connection. Required.
	JetStream jetstream.JetStream
	// Subscriptions are the subscriptions delivered from the start
	// (validated here, their defaults applied); Put, Pause and Remove
	// change the set while the replica runs. May be empty.
	Subscriptions []subscription.Subscription
	// Client sends the webhooks (nil: http.DefaultClient's settings),
	// as subscription.Client makes it for each subscription: no
	// redirects followed, guarded against forbidden addresses without
	// AllowPrivate, with the subscription's client certificate.
	Client *http.Client
	// Breakers holds the endpoints' circuit breakers. Default a Set of
	// default Settings, unregistered. Unless Health is given, New shares
	// it through the health bucket (Set.Share): it must not have been
	// used before New.
	Breakers *breaker.Set
	// Deliveries is jsbridge_consumer_deliveries_total (subscription,
	// outcome, status_class). Default an unregistered counter.
	Deliveries *prometheus.CounterVec
	// DeadLetters stores the events given up on (a *deadletter.DLQ,
	// provisioned), as the old engine does: an event is settled only
	// once its letter is stored; while the store fails it is retried in
	// place. Default nil: a dead-lettered event is logged at error level,
	// not stored, and settled.
	DeadLetters deadletter.Writer
	// Health is the subscriptions' disabled state and failure streaks,
	// fed by every attempt (a 410 Gone or the failure streak rule
	// disables a subscription in the health bucket, and the replica that
	// does announces it), followed by the replica: a disabled
	// subscription stops on every partition it owns (health.go). Given,
	// the caller runs it (Load before Start, Run while the replica runs,
	// as the old engine's Fleet does). Default nil: the replica makes one
	// of Config.Health on its JetStream (its gauge
	// jsbridge_consumer_endpoint_disabled on Registerer; Breakers' open
	// and half-open states shared with the other replicas through its
	// bucket, Breakers.Share), reads it at Start (at most 5 s) and runs
	// it until Stop.
	Health *health.State
	// DeadLettered is jsbridge_consumer_dead_letters_total
	// (subscription), counted for each letter stored. Default nil: not
	// counted.
	DeadLettered *prometheus.CounterVec
	// Registerer, when set, gets the replica's own metrics (shared/metrics:
	// partitions owned, hand-overs, position commits, cursors by
	// state). Default nil: none registered.
	Registerer prometheus.Registerer
	// Attempts receives a record of the attempts AttemptsRecord keeps,
	// after each ended (an *attemptlog.Log, run by the caller), as the
	// old engine's: what `consumer trace` reads. Default nil: no
	// records.
	Attempts attemptlog.Recorder
	// AttemptsRecord says which attempts go to Attempts. Default (""):
	// attemptlog.ModeFailures, every attempt but a success on the first
	// one; attemptlog.ModeAll keeps them all. Another value is an error
	// of Put (attempt.ErrInvalidConfig).
	AttemptsRecord attemptlog.Mode
	// TracerProvider makes the attempt spans, one per attempt, child of
	// the trace context the event's message carries, as the old engine
	// does (attempt/trace.go). Default nil: otel's global provider, a
	// no-op unless the application set one.
	TracerProvider trace.TracerProvider
}

// Replica is one consumer replica of the shared engine. Make one with
// New, Start it once, Stop it once.
type Replica struct {
	lifecycle.Base

	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	members *member.Index
	senders *attempt.Set
	subs    subs // the subscription set and how to make a sender (edit.go)
	metrics *metrics.Metrics
	chain   *chain
	seqs    *seqtime.Finder // the starts' and replay windows' sequences by time
	cursors *cursor.Reader
	rcfg    reader.Config
	letters deadletter.Writer
	dead    *prometheus.CounterVec
	// health is Deps.Health, or the replica's own (ownHealth) that it
	// loads and runs.
	health    *health.State
	ownHealth bool
	bg        sync.WaitGroup // the breakers' and the health's followers
	ages      asideAges      // what the aside-age gauges read (asideage.go)
	follow    context.CancelFunc

	// own is the lease owner open made: atomic, since Owned may be
	// called (a status read, a test) while Start opens or restarts.
	own     atomic.Pointer[owner.Owner]
	epochs  owner.Epochs
	poskv   jetstream.KeyValue
	created time.Time
	// requests are the operator's requests on parked streams
	// (requests.go), watched from Start on.
	requests *unpark.Requests

	loop   *loop
	claims sync.WaitGroup // one per claim being served
	// children are the parts open starts, in this order; run stops
	// them in reverse.
	children []lifecycle.Part

	mu    sync.Mutex
	parts map[int]served // the partitions taken, by number
}

// served is a partition taken under a claim.
type served struct {
	epoch uint64
	fan   *fanout.Partition
}

// PartitionStatus is where one partition taken by the replica stands.
type PartitionStatus struct {
	// Partition and Epoch are the claim's.
	Partition int
	Epoch     uint64
	// Floor is the floor last written to the record; Head the last
	// sequence dispatched live (fanout.Partition.Floor, Head).
	Floor, Head uint64
	// Behind are the subscriptions with a cursor, with its state.
	Behind map[string]string
	// Asides are the streams the partition's record sets aside.
	Asides []position.Aside
}

// New returns a replica of cfg delivering deps.Subscriptions, or an error
// wrapping ErrInvalidConfig (or subscription.ErrInvalidSubscription) that
// names the field. It does no I/O: Start does.
func New(cfg Config, deps Deps) (*Replica, error) {
	if deps.JetStream == nil {
		return nil, fmt.Errorf("%w: Deps.JetStream is nil", ErrInvalidConfig)
	}
	cfg = withDefaults(cfg)
	if cfg.Partitions < 1 || cfg.Partitions > owner.MaxPartitions {
		return nil, fmt.Errorf("%w: Partitions %d: want 1 to %d", ErrInvalidConfig, cfg.Partitions, owner.MaxPartitions)
	}
	r := &Replica{cfg: cfg, js: deps.JetStream, log: cfg.Logger, members: member.NewIndex(),
		senders: attempt.NewSet(), parts: map[int]served{}, letters: deps.DeadLetters, dead: deps.DeadLettered}
	r.rcfg = reader.Config{Stream: cfg.Stream, Prefix: cfg.Prefix, Partitions: cfg.Partitions,
		Name: "jsbridge_reader_" + cfg.Replica, Archetype: cfg.Archetype}
	if deps.Breakers == nil {
		set, err := breaker.NewSet(breaker.Settings{}, r.log, nil)
		if err != nil {
			return nil, fmt.Errorf("shared: breakers: %w", err)
		}
		deps.Breakers = set
	}
	if r.health = deps.Health; r.health == nil {
		names := make([]string, len(deps.Subscriptions))
		for i, s := range deps.Subscriptions {
			names[i] = s.Name
		}
		h, err := health.New(cfg.Health, health.Deps{JetStream: deps.JetStream, Archetype: cfg.Archetype, Replicas: cfg.Replicas, Registerer: deps.Registerer, HTTPClient: egress.NoRedirects(deps.Client),
			Breakers: deps.Breakers}, names)
		if err != nil {
			return nil, fmt.Errorf("%w: Config.Health: %w", ErrInvalidConfig, err)
		}
		r.health, r.ownHealth = h, true
		// The endpoints' open and half-open states are shared with the
		// other replicas through the health bucket, so a dead endpoint
		// gets one probe per open timeout whatever their number
		// (docs/failing-endpoints.md).
		deps.Breakers.Share(h.BreakerStore(), cfg.Replica)
	}
	// The metrics first: each subscription's sender observes its POSTs'
	// durations and rate limit there.
	var err error
	if r.metrics, err = metrics.New(deps.Registerer, metrics.Sources{Owned: func() int { return len(r.Owned()) }, Cursors: r.cursorStates,
		Asides: r.asides, AsideAges: r.asideAges, InFlight: r.senders.InFlight}); err != nil {
		return nil, fmt.Errorf("shared: %w", err)
	}
	if err := r.subscribe(deps); err != nil {
		return nil, err
	}
	r.chain = &chain{js: deps.JetStream, stream: cfg.Stream, members: r.members}
	r.seqs = seqtime.New(cfg.Archetype, deps.JetStream, cfg.Stream)
	r.cursors = cursor.NewReader(deps.JetStream, r.rcfg)
	return r, nil
}

func withDefaults(cfg Config) Config {
	cfg.Archetype = base.Default(cfg.Archetype)
	if cfg.Partitions == 0 {
		cfg.Partitions = 16
	}
	if cfg.Stream == "" {
		cfg.Stream = wire.DefaultEventsStream
	}
	if cfg.Prefix == "" {
		cfg.Prefix = wire.DefaultEventsPrefix
	}
	if cfg.LeaseBucket == "" {
		cfg.LeaseBucket = wire.DefaultLeaseBucket
	}
	if cfg.PositionsBucket == "" {
		cfg.PositionsBucket = position.DefaultBucket
	}
	switch {
	case cfg.OrderStuckAfter == 0:
		cfg.OrderStuckAfter = attempt.DefaultOrderStuckAfter
	case cfg.OrderStuckAfter < 0:
		cfg.OrderStuckAfter = 0 // never order-stuck
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "jsbridge"
	}
	return cfg
}

// subscribe keeps what makes a subscription's attempt.Sender (edit.go)
// and puts deps.Subscriptions.
func (r *Replica) subscribe(deps Deps) error {
	if deps.Deliveries == nil {
		deps.Deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jsbridge_consumer_deliveries_total",
			Help: "Webhook delivery attempts by subscription, outcome and status class."},
			[]string{"subscription", "outcome", "status_class"})
	}
	r.subs = subs{open: egress.NoRedirects(deps.Client), breakers: deps.Breakers, deliveries: deps.Deliveries, tracer: tracing.Tracer(deps.TracerProvider),
		attempts: deps.Attempts, record: deps.AttemptsRecord,
		given: map[string]subscription.Subscription{}, paused: map[string]bool{}, fans: map[*fanout.Partition]int{},
		records: map[*fanout.Partition]flusher{},
		created: map[string]time.Time{}, after: map[string]uint64{}, deleted: map[string]bool{}, opened: map[string]bool{}}
	for _, s := range deps.Subscriptions {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("shared: %w", err)
		}
		if _, dup := r.subs.given[s.Name]; dup {
			return fmt.Errorf("%w: subscription %q: Name: used by two subscriptions", subscription.ErrInvalidSubscription, s.Name)
		}
		if err := r.Put(s); err != nil {
			return err
		}
	}
	return nil
}

// Start opens the lease and positions buckets and starts the replica's
// parts (lifecycle.Part): its health (when its own), the dispatch loop,
// the watch of the operator's requests and the owner; the reader is
// opened when the first partition is claimed (see loop). ctx bounds the
// opening only; the replica runs until Stop. Errors: the buckets', the
// events stream's (it must exist), the owner's; the parts started are
// stopped again. Stop returns once every part it started stopped.
func (r *Replica) Start(ctx context.Context) error { return r.Base.Start(ctx, r.open, r.run) }

// open opens the buckets and starts the parts, in the order run stops
// them in reverse.
func (r *Replica) open(ctx context.Context) error {
	info, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return fmt.Errorf("shared: events stream %s: %w", r.cfg.Stream, err)
	}
	r.created = info.CachedInfo().Created
	r.startNew(info.CachedInfo().State.LastSeq)
	if r.poskv, err = position.Bucket(ctx, r.js, r.cfg.PositionsBucket, r.cfg.Replicas); err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	r.epochs = owner.Epochs{KV: r.poskv}
	r.chain.skipped = r.poskv
	own, err := owner.New(owner.Config{Archetype: r.cfg.Archetype, Partitions: r.cfg.Partitions, Bucket: r.cfg.LeaseBucket,
		LeaseTTL: r.cfg.LeaseTTL, Replicas: r.cfg.Replicas},
		owner.Deps{JetStream: r.js, Epochs: r.epochs}, owner.Callbacks{Gained: r.gained})
	if err != nil {
		return fmt.Errorf("shared: %w", err)
	}
	r.own.Store(own)
	// The breakers exist before the health watch's first values, which
	// hand them the states shared so far (an unknown endpoint's is
	// ignored). Their followers and the health's are r.bg, until run
	// ends r.follow.
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.follow = cancel
	r.watchBreakers(fctx)
	r.subs.mu.Lock() // edits poke the loop
	r.loop = newLoop(r.cfg.Archetype, r.js, r.rcfg, func() int { return len(own.Owned()) })
	r.subs.mu.Unlock()
	r.requests = unpark.New(r.poskv, r.loop.poke)
	r.children = nil
	if r.ownHealth {
		r.children = append(r.children, startHealth{r.health}) // a disabled subscription starts disabled
	}
	r.children = append(r.children, r.loop, r.requests, own)
	r.bg.Go(func() { r.watchHealth(fctx) })
	if err := lifecycle.StartAll(ctx, r.children...); err != nil {
		r.stopFollowers()
		return fmt.Errorf("shared: %w", err)
	}
	return nil
}

// run waits for Stop, then stops the parts open started, the owner
// first: it releases every partition gracefully (each fan-out closed,
// its record committed, its lease deleted, so another replica takes
// over at once); once the claims' goroutines are done, the watch of
// requests, the dispatch loop (and the reader) and the health, the
// reverse of open's order; last the breakers' and health's followers.
func (r *Replica) run(ctx context.Context) error {
	<-ctx.Done()
	r.own.Load().Stop()
	r.claims.Wait() // the partitions' serve goroutines
	lifecycle.StopAll(r.children...)
	r.stopFollowers()
	return nil
}

// stopFollowers ends the breakers' and the health's followers and waits
// for them.
func (r *Replica) stopFollowers() {
	r.subs.mu.Lock()
	r.subs.bctx = nil // no follower of a breaker added from now on (watchBreaker)
	r.subs.mu.Unlock()
	r.follow()
	r.bg.Wait()
}

// startHealth starts the replica's own health with its first read
// bounded by healthLoadTimeout.
type startHealth struct{ *health.State }

func (h startHealth) Start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthLoadTimeout)
	defer cancel()
	return h.State.Start(ctx)
}

// Owned returns the partitions this replica holds and is not releasing,
// sorted.
func (r *Replica) Owned() []int {
	own := r.own.Load()
	if own == nil {
		return nil
	}
	return own.Owned()
}

// Status returns the partitions the replica has taken on its reader,
// by partition number.
func (r *Replica) Status() []PartitionStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PartitionStatus, 0, len(r.parts))
	for p, sv := range r.parts {
		out = append(out, PartitionStatus{Partition: p, Epoch: sv.epoch, Floor: sv.fan.Floor(), Head: sv.fan.Head(),
			Behind: sv.fan.Behind(), Asides: sv.fan.Asides()})
	}
	slices.SortFunc(out, func(a, b PartitionStatus) int { return a.Partition - b.Partition })
	return out
}

// asides returns the replica's subscriptions and the streams set aside
// on the partitions it serves (the streams gauges).
func (r *Replica) asides() ([]string, []position.Aside) {
	var out []position.Aside
	for _, p := range r.Status() {
		out = append(out, p.Asides...)
	}
	return r.Names(), out
}

// cursorStates returns, per partition the replica serves, its
// subscriptions with a cursor and their states (the cursors gauge).
func (r *Replica) cursorStates() []map[string]string {
	st := r.Status()
	out := make([]map[string]string, len(st))
	for i, p := range st {
		out[i] = p.Behind
	}
	return out
}
