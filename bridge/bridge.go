// Package bridge runs the jsbridge bridge inside a Go application: the
// Postgres store, the drain and the JetStream forwarder assembled, as
// `bridge run` assembles them, behind New, Start, Stop and Ready.
//
//	b, err := bridge.New(pool, js, bridge.Config{Migrate: true})
//	if err != nil { ... }
//	if err := b.Start(ctx); err != nil { ... }
//	defer b.Stop(context.Background())
//
// The application appends events with package store (store.Append or
// AppendTx in its own transaction); the bridge forwards them to JetStream
// with Nats-Msg-Id = event id, each stream in order, under the same leases
// as every other bridge on the same schema, so an in-process bridge and
// `bridge run` processes can drain one store together.
package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/store"
)

// ErrAlreadyStarted is returned by Start or Run on a Bridge that runs or
// ran already: a Bridge drains once; make a new one to start again.
var ErrAlreadyStarted = errors.New("bridge: already started")

// Bridge drains one event store into one JetStream stream. Its methods are
// safe for concurrent use.
type Bridge struct {
	cfg   Config
	pool  *pgxpool.Pool
	js    jetstream.JetStream
	store *store.Store
	drain *drain.Drain
	// storage says whether JetStream refuses publishes for lack of space.
	storage *storageWatch

	life *lifecycle.Runner
}

// New assembles a bridge on pool and js without touching either: it
// checks cfg (Validate: an error wrapping ErrInvalidConfig names the
// field and the value), fills its defaults,
// lowers a PublishTimeout that does not fit Lease to
// MaxPublishTimeout with a warning, and registers the metrics on
// cfg.Registerer (an error when they are registered there already). pool
// and js must not be nil.
func New(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config) (*Bridge, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream is nil", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	// A cycle's publishes must end before its deadline (80% of the lease
	// from the claim) cuts them short: see MaxPublishTimeout.
	if fit, lowered := FitPublishTimeout(cfg.PublishTimeout, cfg.Lease); lowered {
		log.Warn(fmt.Sprintf("PublishTimeout %s does not fit Lease %s (at most 40%% of it): using %s", cfg.PublishTimeout, cfg.Lease, fit),
			"publish_timeout", fit, "lease", cfg.Lease)
		cfg.PublishTimeout = fit
	}

	st, err := newStore(pool, cfg)
	if err != nil {
		return nil, err
	}
	var (
		dobs    drain.Observer
		metrics *bridgemetrics.Metrics
	)
	switch {
	case cfg.Metrics != nil:
		metrics = cfg.Metrics.m
	case cfg.Registerer != nil:
		if metrics, err = bridgemetrics.New(cfg.Registerer, st.Backlog, log); err != nil {
			return nil, fmt.Errorf("bridge metrics: %w", err)
		}
	}
	watch := &storageWatch{log: log}
	if metrics != nil {
		dobs, watch.next, watch.gauge = metrics, metrics, metrics.BusUnavailable
	}
	fwd, err := forward.New(js, forward.Config{
		Prefix: cfg.SubjectPrefix, Source: cfg.Source, Stream: cfg.Stream, MaxInFlight: cfg.MaxInFlight,
		PublishTimeout: cfg.PublishTimeout, Logger: log, Observer: watch, TracerProvider: cfg.TracerProvider,
	})
	if err != nil {
		// Config.Validate checked what forward checks: not a config error.
		return nil, fmt.Errorf("bridge forwarder: %w", err)
	}
	d, err := drain.New(st, fwd, drain.Config{
		Owner: cfg.Owner, Lease: cfg.Lease, ClaimLimit: cfg.ClaimLimit, FetchLimit: cfg.FetchLimit,
		PollInterval: cfg.PollInterval, Linger: cfg.Linger, MaxRetries: cfg.MaxRetries, ShutdownGrace: cfg.ShutdownGrace,
		Notifier: st, Logger: log, Observer: dobs,
	})
	if err != nil {
		return nil, fmt.Errorf("bridge drain: %w", err)
	}
	return &Bridge{cfg: cfg, pool: pool, js: js, store: st, drain: d, storage: watch, life: lifecycle.New(ErrAlreadyStarted)}, nil
}

// Config returns the bridge's configuration with its defaults filled in
// (and PublishTimeout as fitted to Lease).
func (b *Bridge) Config() Config { return b.cfg }

// Owner returns the name this bridge takes leases under.
func (b *Bridge) Owner() string { return b.drain.Owner() }

// EventsTable returns the events table the bridge drains, as schema.table.
func (b *Bridge) EventsTable() string { return b.store.EventsTable() }

// Migrate applies the pending migrations of the bridge's schema (see
// store.Store.Migrate); Start calls it when Config.Migrate is set.
func (b *Bridge) Migrate(ctx context.Context) error {
	if err := b.store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate schema %s: %w", b.cfg.Schema, err)
	}
	return nil
}

// Provision makes sure the JetStream stream exists (created with subjects
// "<SubjectPrefix>.>", file storage, DuplicateWindow, Replicas, MaxAge,
// MaxBytes, MaxMsgsPerSubject and Compress when missing, never changed
// when it exists), logs its retention and compression (Info) and its
// warnings (a shorter duplicate window, memory storage, another replica
// count, other limits, no compression although Compress asks for it). Errors wrap
// ErrSubjectsNotCovered when an existing stream does not take the
// bridge's subjects, ErrReplicasNotSupported when Replicas > 1 meets a
// standalone server, else JetStream's error; retrying helps only with the
// last. Start calls it.
func (b *Bridge) Provision(ctx context.Context) error {
	prov, err := forward.Provision(ctx, b.js, forward.StreamConfig{
		Name: b.cfg.Stream, Prefix: b.cfg.SubjectPrefix, DuplicateWindow: b.cfg.DuplicateWindow, Replicas: b.cfg.Replicas,
		Limits: b.cfg.limits(), Compress: b.cfg.Compress,
	})
	switch {
	case errors.Is(err, forward.ErrSubjectsNotCovered):
		return fmt.Errorf("%w: %v", ErrSubjectsNotCovered, err)
	case errors.Is(err, forward.ErrReplicasNotSupported):
		return fmt.Errorf("%w: %v", ErrReplicasNotSupported, err)
	case errors.Is(err, forward.ErrInvalidConfig):
		// Validate checks the same: not expected here.
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	case err != nil:
		return err
	}
	for _, warning := range prov.Warnings {
		b.cfg.Logger.Warn(warning, "jetstream_stream", b.cfg.Stream)
	}
	b.cfg.Logger.Info("JetStream stream retention", "jetstream_stream", b.cfg.Stream, "created", prov.Created,
		"max_age", prov.Limits.MaxAge, "max_bytes", prov.Limits.MaxBytes, "max_msgs_per_subject", prov.Limits.MaxMsgsPerSubject,
		"compressed", prov.Compressed)
	return nil
}

// Start warns when DuplicateWindow is shorter than Lease plus
// PublishTimeout, applies the migrations (when Config.Migrate), provisions
// the JetStream stream, then drains in the background until Stop is called or
// ctx ends (either is a graceful stop, as on SIGTERM). It returns the
// first step's error that failed, without draining; it does not wait for
// Postgres or NATS to come up (retry Start, or wait before it). A Start
// after one that succeeded, or after Run, returns ErrAlreadyStarted.
func (b *Bridge) Start(ctx context.Context) error {
	return b.life.Start(ctx, b.setup, b.run)
}

// setup is Start's first part: the warning, the migrations, the stream.
func (b *Bridge) setup(ctx context.Context) error {
	// A bridge that dies after publishing and before acking is taken over
	// after its lease; the takeover's re-publish must fall in the window.
	// (Said here, not in New, so that `bridge run`, which uses Run, says it
	// in terms of its flags.)
	if need := RequiredDuplicateWindow(b.cfg.Lease, b.cfg.PublishTimeout); b.cfg.DuplicateWindow < need {
		b.cfg.Logger.Warn("DuplicateWindow is shorter than Lease plus PublishTimeout: an event re-published after a takeover may be stored twice",
			"duplicate_window", b.cfg.DuplicateWindow, "need", need)
	}
	if b.cfg.Migrate {
		if err := b.Migrate(ctx); err != nil {
			return err
		}
	}
	if err := b.Provision(ctx); err != nil {
		return fmt.Errorf("provision JetStream stream %q: %w", b.cfg.Stream, err)
	}
	return nil
}

// Run drains in the foreground until ctx ends or Stop is called, then
// stops gracefully as Stop does and returns. It neither warns, migrates
// nor provisions: it is for a caller that did all three itself (Migrate,
// Provision), as `bridge run` does while waiting for its dependencies. A
// Bridge runs once: Run after Start, or a second Run, returns
// ErrAlreadyStarted.
func (b *Bridge) Run(ctx context.Context) error {
	return b.life.Run(ctx, nil, b.run)
}

// run drains until ctx ends, then closes the store's background work (its
// vacuum of the marker table), so that the caller may close the pool once
// Stop or Run returns.
func (b *Bridge) run(ctx context.Context) error {
	defer b.store.Close()
	return b.drain.Run(ctx)
}

// Stop stops the drain started by Start (or Run) with the same guarantees
// as SIGTERM to `bridge run`: no new claim is made, the batch in flight
// may go on for ShutdownGrace, what it published is acked and the rest of
// its streams released (no retry counted), so another bridge takes them
// up at once. It returns the drain's error (nil after a clean stop) when
// the drain has stopped and the store's background work has ended (its
// vacuum of the marker table, cancelled: the pool may be closed then), or
// ctx's error when ctx ends first (the drain then finishes stopping in the
// background, and a later Stop waits again). Stop while Start migrates or provisions cancels that. Stop
// before Start is a no-op returning nil; a second Stop returns the
// first's result.
func (b *Bridge) Stop(ctx context.Context) error {
	if err := b.life.Stop(ctx); err != nil {
		return fmt.Errorf("stop bridge: %w", err)
	}
	return nil
}

// Ready reports whether the bridge can work: nil when Postgres answers a
// ping, the JetStream stream exists and JetStream stores the bridge's
// publishes, else an error saying which is missing (StorageErr's while
// publishes are refused for lack of storage). Wire it into the
// application's readiness endpoint.
func (b *Bridge) Ready(ctx context.Context) error {
	if err := b.StorageErr(); err != nil {
		return err
	}
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if _, err := b.js.Stream(ctx, b.cfg.Stream); err != nil {
		return fmt.Errorf("jetstream stream %s: %w", b.cfg.Stream, err)
	}
	return nil
}

// StorageErr returns an error wrapping ErrStorageFull, naming when it
// began and JetStream's refusal, while JetStream refuses the bridge's
// publishes for lack of storage (from the first refusal until a publish
// is stored again); else nil. Ready includes it; `bridge run`'s /readyz
// answers 503 with it under the check "jetstream_storage".
func (b *Bridge) StorageErr() error { return b.storage.err() }

// newStore opens the store cfg (with its defaults) describes on pool.
func newStore(pool *pgxpool.Pool, cfg Config) (*store.Store, error) {
	opts := []store.Option{store.WithSchema(cfg.Schema)}
	if cfg.EventsTable != "" {
		opts = append(opts, store.WithEventsTable(cfg.EventsTable))
	}
	st, err := store.New(pool, append(opts, store.WithDiscoveryInterval(cfg.PollInterval),
		store.WithSettleTimeout(cfg.SettleTimeout), store.WithLogger(cfg.Logger))...)
	if err != nil {
		// Validate checked what the store checks: not expected here.
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return st, nil
}

// Metrics are the bridge's Prometheus metrics (jsbridge_bridge_*; see
// docs/observability.md), registered before the bridge exists: pass them to New in
// Config.Metrics.
type Metrics struct {
	m *bridgemetrics.Metrics
}

// NewMetrics registers the bridge's metrics on reg, reading the backlog
// gauges (blocked, lagging, oldest unforwarded event) from the store cfg
// describes on pool at each scrape, so they are exported while the process
// still waits for NATS. It fails like New on a bad cfg, when reg or pool is
// nil, or when the metrics are registered on reg already.
func NewMetrics(reg prometheus.Registerer, pool *pgxpool.Pool, cfg Config) (*Metrics, error) {
	if reg == nil || pool == nil {
		return nil, fmt.Errorf("%w: NewMetrics needs a registerer and a pool", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	st, err := newStore(pool, cfg)
	if err != nil {
		return nil, err
	}
	m, err := bridgemetrics.New(reg, st.Backlog, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("bridge metrics: %w", err)
	}
	return &Metrics{m: m}, nil
}
