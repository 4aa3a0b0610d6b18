package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/internal/otelenv"
	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/store"
)

type runCmd struct {
	NatsURL          string `name:"nats-url" env:"NATS_URL" help:"NATS server URL(s), comma-separated (default: the --context's url). Ignored with --embedded-nats."`
	natsconn.Flags   `embed:""`
	EmbeddedNats     bool          `name:"embedded-nats" env:"JSBRIDGE_EMBEDDED_NATS" help:"Run an in-process NATS server with JetStream instead of connecting to --nats-url (off by default; make run turns it on for one machine)."`
	EmbeddedNatsDir  string        `name:"embedded-nats-dir" env:"JSBRIDGE_EMBEDDED_NATS_DIR" default:".data/nats" help:"JetStream store directory of the embedded server (default: ${default})."`
	EmbeddedNatsHost string        `name:"embedded-nats-host" env:"JSBRIDGE_EMBEDDED_NATS_HOST" default:"127.0.0.1" help:"Listen address of the embedded server; loopback so the nats CLI can look in (default: ${default})."`
	EmbeddedNatsPort int           `name:"embedded-nats-port" env:"JSBRIDGE_EMBEDDED_NATS_PORT" default:"4222" help:"Client port of the embedded server; -1 picks a free one (default: ${default})."`
	Stream           string        `name:"stream" env:"JSBRIDGE_STREAM" default:"${events_stream}" help:"JetStream stream to publish to; created if missing (default: ${default})."`
	SubjectPrefix    string        `name:"subject-prefix" env:"JSBRIDGE_SUBJECT_PREFIX" default:"${events_prefix}" help:"First subject token; events go to <prefix>.<category>.<stream>.<name> (default: ${default})."`
	Source           string        `name:"source" env:"JSBRIDGE_SOURCE" default:"jsbridge" help:"CloudEvents source attribute (ce-source) of every event (default: ${default})."`
	StreamReplicas   int           `name:"stream-replicas" env:"JSBRIDGE_STREAM_REPLICAS" default:"1" help:"JetStream storage replica count (R) of the stream when the bridge creates it, not a count of bridge processes: 1 on a standalone server, 3 on a cluster; an existing stream keeps its own, with a warning (default: ${default})."`
	DuplicateWindow  time.Duration `name:"duplicate-window" env:"JSBRIDGE_DUPLICATE_WINDOW" default:"2m" help:"JetStream duplicate window for a stream the bridge creates; warned about at start when shorter than --lease plus --publish-timeout (default: ${default})."`
	Owner            string        `name:"owner" env:"JSBRIDGE_OWNER" help:"Lease holder name of this bridge (default: hostname-pid-random)."`
	Lease            time.Duration `name:"lease" env:"JSBRIDGE_LEASE" default:"30s" help:"How long a claimed stream stays leased to this bridge; a dead bridge's streams are taken over after it (default: ${default})."`
	ClaimLimit       int           `name:"claim-limit" env:"JSBRIDGE_CLAIM_LIMIT" default:"100" help:"Streams claimed per drain cycle; with a backlog the next cycle is claimed while one is published, so up to twice this many are held (default: ${default})."`
	FetchLimit       int           `name:"fetch-limit" env:"JSBRIDGE_FETCH_LIMIT" default:"500" help:"Events fetched per stream per drain cycle (default: ${default})."`
	PollInterval     time.Duration `name:"poll-interval" env:"JSBRIDGE_POLL_INTERVAL" default:"1s" help:"Poll period when idle; LISTEN/NOTIFY usually wakes the bridge sooner (default: ${default})."`
	Linger           time.Duration `name:"linger" env:"JSBRIDGE_LINGER" default:"0s" help:"After a drain cycle that forwarded events without a backlog, wait this long before acking it and claiming again (in one transaction), so one cycle carries what many streams appended meanwhile (fewer Postgres statements at steady rates; an event appended meanwhile waits up to this more); 0 claims again at once (default: ${default})."`
	MaxRetries       int           `name:"max-retries" env:"JSBRIDGE_MAX_RETRIES" default:"10" help:"Failed attempts on a stream before it is blocked (default: ${default})."`
	MaxInFlight      int           `name:"max-in-flight" env:"JSBRIDGE_BRIDGE_MAX_IN_FLIGHT" default:"256" help:"Streams published concurrently (each stream stays in order) (default: ${default})."`
	PublishTimeout   time.Duration `name:"publish-timeout" env:"JSBRIDGE_PUBLISH_TIMEOUT" default:"5s" help:"How long to wait for JetStream to acknowledge one publish; at most 40% of --lease, lowered with a warning otherwise (default: ${default})."`
	ShutdownGrace    time.Duration `name:"shutdown-grace" env:"JSBRIDGE_SHUTDOWN_GRACE" default:"10s" help:"On SIGTERM, how long the batch in flight may go on; what it publishes is acked, the rest released (default: ${default})."`
	StartupTimeout   time.Duration `name:"startup-timeout" env:"JSBRIDGE_STARTUP_TIMEOUT" default:"0s" help:"Give up (exit 1, naming what is missing) when Postgres, its migrations, NATS or the JetStream stream are not available within this time; 0 waits forever (default: ${default})."`
	Migrate          bool          `name:"migrate" env:"JSBRIDGE_MIGRATE" default:"true" negatable:"" help:"Apply pending migrations at start (default: ${default})."`
	SettleTimeout    time.Duration `name:"settle-timeout" env:"JSBRIDGE_SETTLE_TIMEOUT" default:"5s" help:"How long an ack, retry or block may wait for a stream's row that an application transaction holds (Postgres lock_timeout); past it the settle fails and the bridge ends the stream's lease at its next cycle, so the stream is claimed again at once (default: ${default})."`
	Pprof            bool          `name:"pprof" env:"JSBRIDGE_PPROF" help:"Serve Go profiles under /debug/pprof/ on the ops port."`
	OpsAddr          string        `name:"ops-addr" env:"JSBRIDGE_BRIDGE_OPS_ADDR" default:"127.0.0.1:9464" help:"Address of the ops port serving /metrics, /healthz and /readyz; empty disables it (default: ${default})."`

	// Retention of the JetStream stream the bridge creates (docs/retention.md).
	MaxAge            time.Duration `name:"max-age" env:"JSBRIDGE_MAX_AGE" default:"168h" help:"Retention of the JetStream stream when the bridge creates it: a message is removed once older than this (Postgres keeps every event); 0 keeps messages forever. At least --duplicate-window. An existing stream keeps its own, logged; bridge retention changes it (see docs/retention.md) (default: ${default}, 7 days)."`
	MaxBytes          int64         `name:"max-bytes" env:"JSBRIDGE_MAX_BYTES" default:"0" help:"Retention of the JetStream stream when the bridge creates it: the oldest messages are removed while it holds more than this many bytes; 0 is no limit. An existing stream keeps its own; bridge retention changes it (default: ${default})."`
	MaxMsgsPerSubject int64         `name:"max-msgs-per-subject" env:"JSBRIDGE_MAX_MSGS_PER_SUBJECT" default:"0" help:"Retention of the JetStream stream when the bridge creates it: only the last this many messages of each subject (one event name of one stream) are kept; 0 is no limit. An existing stream keeps its own; bridge retention changes it (default: ${default})."`
	Compression       string        `name:"compression" env:"JSBRIDGE_COMPRESSION" enum:"none,s2" default:"none" help:"Compression of the JetStream stream when the bridge creates it: none, or s2 (about 2.7 times smaller on disk with JSON events; reading an older message decompresses its block). An existing stream keeps its own (see docs/retention.md) (default: ${default})."`
}

// Run starts the ops port, then waits for Postgres, its migrations, NATS
// and the JetStream stream (see startup), and drains until ctx ends. It
// fails only for what waiting cannot fix, or at --startup-timeout; a stop
// while it waits is a clean exit.
func (r *runCmd) Run(ctx context.Context, g *Globals) error {
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	conn, err := r.natsSettings()
	if err != nil {
		return err
	}
	if r.StreamReplicas < 1 {
		return fmt.Errorf("--stream-replicas (JSBRIDGE_STREAM_REPLICAS) %d: want 1 or more", r.StreamReplicas)
	}
	// The pool connects lazily: a bad URL fails here, a database that is
	// down is waited for below. st only migrates: the bridge has its own.
	pool, st, err := openStore(ctx, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	opsSrv := ops.NewServer()
	// A cycle's publishes must end before its deadline (80% of the lease
	// from the claim) cuts them short: see bridge.MaxPublishTimeout.
	// Fitted here so the warning names the flags; bridge.New then agrees.
	if fit, lowered := bridge.FitPublishTimeout(r.PublishTimeout, r.Lease); lowered {
		log.Warn(fmt.Sprintf("--publish-timeout %s does not fit --lease %s (at most 40%% of it): using %s", r.PublishTimeout, r.Lease, fit),
			"publish_timeout", fit, "lease", r.Lease)
		r.PublishTimeout = fit
	}
	// A bridge that dies after publishing and before acking is taken over
	// after its lease; the takeover's re-publish must fall in the window.
	// (bridge.Start says the same in Config's terms; Run does not.)
	if need := bridge.RequiredDuplicateWindow(r.Lease, r.PublishTimeout); r.DuplicateWindow < need {
		log.Warn("--duplicate-window is shorter than --lease plus --publish-timeout: an event re-published after a takeover may be stored twice",
			"duplicate_window", r.DuplicateWindow, "need", need)
	}
	cfg := r.config(g, log, nil)
	if err := cfg.Validate(); err != nil {
		return flagNames(err)
	}
	// Registered now, so /metrics has the backlog gauges (read from
	// Postgres) while the bridge still waits for NATS.
	if cfg.Metrics, err = bridge.NewMetrics(opsSrv.Registry, pool, cfg); err != nil {
		return err
	}

	// The ops port comes first: /healthz answers and /readyz says what is
	// waited for while the dependencies are not there yet.
	w := startup.New(log, r.StartupTimeout)
	var jsRef startup.JetStreamRef
	opsSrv.AddCheck("startup", w.Check)
	opsSrv.AddCheck("postgres", func(ctx context.Context) error { return pool.Ping(ctx) })
	opsSrv.AddCheck("jetstream", jsRef.StreamCheck(r.Stream))
	// 503 naming the cause while JetStream refuses publishes for lack of
	// storage (bridge.ErrStorageFull).
	var running atomic.Pointer[bridge.Bridge]
	opsSrv.AddCheck("jetstream_storage", func(context.Context) error {
		if b := running.Load(); b != nil {
			return b.StorageErr()
		}
		return nil
	})
	opsSrv.Pprof = r.Pprof
	addr, err := opsSrv.Start(r.OpsAddr)
	if err != nil {
		return err
	}
	defer opsSrv.Stop()

	tp, stopTracing, err := otelenv.Start(ctx, "jsbridge-bridge", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	cfg.TracerProvider = tp

	nc, shutdownNATS, b, err := r.start(ctx, w, log, conn, pool, st, cfg, &jsRef)
	if shutdownNATS != nil {
		defer shutdownNATS()
	}
	if err != nil {
		if ctx.Err() != nil {
			log.Info("bridge stopped while starting", "error", err)
			return nil
		}
		return err
	}
	running.Store(b)
	w.Ready()
	log.Info("bridge started", "jetstream_stream", r.Stream, "nats_url", startup.RedactURL(nc.ConnectedUrl()), "ops_addr", addr, "lease", r.Lease, "events_table", b.EventsTable())
	err = b.Run(ctx)
	log.Info("bridge stopped")
	return err
}

// config maps the flags to the bridge's configuration: everything but
// connecting, waiting and the ops port.
func (r *runCmd) config(g *Globals, log *slog.Logger, reg prometheus.Registerer) bridge.Config {
	return bridge.Config{
		Schema: g.Schema, EventsTable: g.EventsTable,
		Stream: r.Stream, SubjectPrefix: r.SubjectPrefix, Source: r.Source, DuplicateWindow: r.DuplicateWindow,
		Replicas: r.StreamReplicas,
		Owner:    r.Owner, Lease: r.Lease, ClaimLimit: r.ClaimLimit, FetchLimit: r.FetchLimit,
		PollInterval: r.PollInterval, Linger: r.Linger, MaxRetries: r.MaxRetries, MaxInFlight: r.MaxInFlight,
		PublishTimeout: r.PublishTimeout, ShutdownGrace: r.ShutdownGrace, SettleTimeout: r.SettleTimeout,
		Migrate: r.Migrate, Logger: log, Registerer: reg,
		MaxAge: r.MaxAge, MaxBytes: r.MaxBytes, MaxMsgsPerSubject: r.MaxMsgsPerSubject,
		Compress: r.Compression == "s2",
	}
}

// start waits for Postgres and applies the migrations (unless --no-migrate),
// connects to NATS (or starts the embedded server), assembles the bridge
// and provisions the JetStream stream, each step waited for with w. It
// returns the connection, a func that closes it (and stops the embedded
// server; nil when there is nothing to close) and the bridge.
func (r *runCmd) start(ctx context.Context, w *startup.Waiter, log *slog.Logger, conn natsconn.Settings, pool *pgxpool.Pool, st *store.Store,
	cfg bridge.Config, jsRef *startup.JetStreamRef) (*nats.Conn, func(), *bridge.Bridge, error) {
	if err := waitPostgres(ctx, w, pool); err != nil {
		return nil, nil, nil, err
	}
	if r.Migrate {
		err := w.For(ctx, "Postgres migrations of schema "+st.Schema(), func(ctx context.Context) error {
			return postgresErr(flagNames(st.Migrate(ctx)))
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("migrate: %w", err)
		}
	}
	nc, shutdownNATS, err := r.connectNATS(ctx, w, log, conn)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := conn.JetStream(nc)
	if err != nil {
		return nc, shutdownNATS, nil, fmt.Errorf("jetstream: %w", err)
	}
	jsRef.Set(js)
	if warning := startup.ReplicasWarning(r.StreamReplicas, nc.ConnectedServerName(), nc.ConnectedClusterName()); warning != "" {
		log.Warn(warning, "replicas", r.StreamReplicas)
	}
	b, err := bridge.New(pool, js, cfg)
	if err != nil {
		return nc, shutdownNATS, nil, flagNames(err)
	}
	err = w.For(ctx, "JetStream stream "+r.Stream, func(ctx context.Context) error {
		err := b.Provision(ctx)
		if errors.Is(err, bridge.ErrSubjectsNotCovered) || errors.Is(err, bridge.ErrReplicasNotSupported) || errors.Is(err, bridge.ErrInvalidConfig) {
			return startup.Permanent(err)
		}
		return startup.JetStreamErr(err)
	})
	if err != nil {
		return nc, shutdownNATS, nil, fmt.Errorf("provision JetStream stream %q: %w", r.Stream, err)
	}
	return nc, shutdownNATS, b, nil
}

// natsSettings checks the NATS flags: --embedded-nats ignores --nats-url
// (as it always has) but refuses the authentication, TLS and context
// flags: its server has none, and a user who set them meant another
// server. Without it a URL is needed, from --nats-url or the --context.
func (r *runCmd) natsSettings() (natsconn.Settings, error) {
	if r.EmbeddedNats {
		if given := r.Flags.Given(); len(given) > 0 {
			return natsconn.Settings{}, fmt.Errorf("--embedded-nats runs its own server without authentication and cannot be combined with %s (set by flag or environment); drop them, or drop --embedded-nats to connect to that server", strings.Join(given, ", "))
		}
		return natsconn.Settings{}, nil
	}
	conn, err := r.Flags.Resolve(r.NatsURL)
	if err != nil {
		return natsconn.Settings{}, err
	}
	if conn.URL == "" {
		return natsconn.Settings{}, errors.New("--nats-url (NATS_URL) is empty: give a NATS server URL, a --context with a url, or use --embedded-nats")
	}
	return conn, nil
}

// connectNATS starts the embedded server or connects to the server(s) of
// conn, waiting with w for a server to answer; the returned func closes
// the connection (and stops the embedded server).
func (r *runCmd) connectNATS(ctx context.Context, w *startup.Waiter, log *slog.Logger, conn natsconn.Settings) (*nats.Conn, func(), error) {
	opts := startup.NATSOptions(log, "jsbridge-bridge")
	if !r.EmbeddedNats {
		log.Info("connecting to NATS", "nats_url", startup.RedactURL(conn.URL), "nats_auth", conn.Auth, "nats_tls", conn.TLS, "jetstream_api", conn.JetStreamAPI())
		nc, err := startup.ConnectNATS(ctx, w, conn.URL, append(opts, conn.Options()...)...)
		if err != nil {
			return nil, nil, err
		}
		return nc, nc.Close, nil
	}
	if err := os.MkdirAll(r.EmbeddedNatsDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("--embedded-nats-dir %q: %w", r.EmbeddedNatsDir, err)
	}
	srv, err := embedded.Start(embedded.Config{Dir: r.EmbeddedNatsDir, Host: r.EmbeddedNatsHost, Port: r.EmbeddedNatsPort})
	if errors.Is(err, embedded.ErrPortInUse) {
		return nil, nil, fmt.Errorf("--embedded-nats-port %d: %w; choose another port with --embedded-nats-port (JSBRIDGE_EMBEDDED_NATS_PORT), -1 for a free one", r.EmbeddedNatsPort, err)
	}
	if err != nil {
		return nil, nil, err
	}
	log.Info("embedded NATS server started", "url", srv.ClientURL(), "dir", r.EmbeddedNatsDir)
	nc, err := srv.Connect(opts...)
	if err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	return nc, func() { nc.Close(); srv.Shutdown() }, nil
}

// openStore connects to --database-url and opens the store in --schema
// (and --events-table).
func openStore(ctx context.Context, g *Globals, opts ...store.Option) (*pgxpool.Pool, *store.Store, error) {
	if g.DatabaseURL == "" {
		return nil, nil, errors.New("--database-url (DATABASE_URL) is empty: give a Postgres URL, e.g. postgres://user@localhost:5432/app")
	}
	pool, err := pgxpool.New(ctx, g.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("--database-url: %w", err)
	}
	st, err := store.New(pool, g.storeOptions(opts...)...)
	if err != nil {
		pool.Close()
		return nil, nil, flagNames(err)
	}
	return pool, st, nil
}

// storeOptions are the store options the global flags give.
func (g *Globals) storeOptions(extra ...store.Option) []store.Option {
	opts := []store.Option{store.WithSchema(g.Schema)}
	if g.EventsTable != "" {
		opts = append(opts, store.WithEventsTable(g.EventsTable))
	}
	return append(opts, extra...)
}
