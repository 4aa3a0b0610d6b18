package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of Config: a zero field means the default below. They are the
// defaults of the packages that own each knob, spelled once here for the
// bridge; `bridge run`'s flags default to the same values.
const (
	// DefaultSchema is the Postgres schema of the bridge's tables.
	DefaultSchema = store.DefaultSchema
	// DefaultStream is the JetStream stream events are published to.
	DefaultStream = wire.DefaultEventsStream
	// DefaultSubjectPrefix is the first subject token: events go to
	// <prefix>.<category>.<stream>.<name>.
	DefaultSubjectPrefix = wire.DefaultEventsPrefix
	// DefaultSource is the CloudEvents source attribute (ce-source).
	DefaultSource = forward.DefaultSource
	// DefaultDuplicateWindow is the duplicate window of a JetStream stream
	// the bridge creates (2 min).
	DefaultDuplicateWindow = forward.DefaultDuplicateWindow
	// DefaultReplicas is the replica count of a JetStream stream the bridge
	// creates (1).
	DefaultReplicas = 1
	// DefaultLease is how long a claimed stream stays leased (30 s).
	DefaultLease = drain.DefaultLease
	// DefaultClaimLimit is how many streams one drain cycle claims (100).
	DefaultClaimLimit = drain.DefaultClaimLimit
	// DefaultFetchLimit is how many events per stream one cycle fetches (500).
	DefaultFetchLimit = drain.DefaultFetchLimit
	// DefaultPollInterval is the poll period when idle (1 s).
	DefaultPollInterval = drain.DefaultPollInterval
	// DefaultMaxRetries is how many failed attempts a stream may retry
	// before it is blocked (10).
	DefaultMaxRetries = drain.DefaultMaxRetries
	// DefaultMaxInFlight is how many streams are published concurrently (256).
	DefaultMaxInFlight = forward.DefaultMaxInFlight
	// DefaultPublishTimeout bounds one publish, from send to PubAck (5 s).
	DefaultPublishTimeout = forward.DefaultPublishTimeout
	// DefaultShutdownGrace is how long the batch in flight may go on after
	// Stop (10 s).
	DefaultShutdownGrace = drain.DefaultShutdownGrace
	// DefaultSettleTimeout bounds one ack, retry or block statement (5 s).
	DefaultSettleTimeout = store.DefaultSettleTimeout
)

// ErrInvalidConfig is wrapped by the errors of New, Validate, NewMetrics
// and Verify about a configuration field; the message names the field
// and the value (`Config.Lease 500µs is below 1ms`), never a flag: `bridge run`
// maps fields to its flags.
var ErrInvalidConfig = errors.New("invalid bridge config")

// ErrSubjectsNotCovered is wrapped by Provision (and Start) when the
// JetStream stream exists and none of its subjects takes
// "<SubjectPrefix>.>": the stream belongs to something else, or
// SubjectPrefix is wrong. Waiting does not help.
var ErrSubjectsNotCovered = errors.New("JetStream stream does not cover the subject prefix")

// ErrReplicasNotSupported is wrapped by Provision (and Start) when Config.Replicas
// is above 1 and the server is not part of a JetStream cluster.
var ErrReplicasNotSupported = errors.New("replicas > 1 need a clustered JetStream")

// Config configures a Bridge: every knob of `bridge run` that is not about
// connecting. The zero value of every field means its default (Default*).
type Config struct {
	// Schema is the Postgres schema holding the bridge's tables (streams,
	// and events unless EventsTable). A plain lowercase identifier.
	// Default "jsbridge".
	Schema string
	// EventsTable, as "schema.table", drains an existing events table of
	// the common layout that another program writes; new events are found
	// by polling every PollInterval. Default "": the bridge's own
	// <Schema>.events.
	EventsTable string
	// Stream is the JetStream stream to publish to; Start creates it when
	// missing and never changes an existing one. Default "EVENTS".
	Stream string
	// SubjectPrefix is the first subject token. Default "events".
	SubjectPrefix string
	// Source is the CloudEvents source attribute of every event.
	// Default "jsbridge".
	Source string
	// DuplicateWindow is the duplicate window of a stream Start creates; it
	// should cover Lease plus PublishTimeout (Start warns otherwise).
	// Default 2 min.
	DuplicateWindow time.Duration
	// Replicas is the replica count of a stream Start creates: 1 on a
	// standalone server, 3 on a cluster (more than 1 on a standalone server
	// makes Start fail with ErrReplicasNotSupported). An existing
	// stream keeps its own; Start warns when it differs. Default 1.
	Replicas int
	// MaxAge, MaxBytes and MaxMsgsPerSubject are the retention of a
	// stream Start creates: JetStream removes a message once it is older
	// than MaxAge, the oldest messages while the stream holds more than
	// MaxBytes bytes, and all but the last MaxMsgsPerSubject messages of a
	// subject (one event name of one source stream). Zero means no limit
	// (every event is kept forever; `bridge run --max-age` defaults to
	// DefaultMaxAge instead). An existing stream keeps its own; Provision
	// logs them, and warns when they differ; SetRetention changes them.
	// What each gives up: docs/retention.md. The drain tells a stream
	// whose messages aged out from one JetStream lost, and Verify reports
	// aged-out events apart from missing ones.
	MaxAge            time.Duration
	MaxBytes          int64
	MaxMsgsPerSubject int64
	// Compress asks for S2 compression of a stream Start creates:
	// JetStream compresses each full block (8 MiB) of its file store, about
	// 2.7 × smaller with JSON events, and decompresses a block to read an
	// older message from it (reconciliation, Verify, a consumer far
	// behind). MaxBytes counts uncompressed bytes. Default false. An
	// existing stream keeps its own; Start warns when compression is asked
	// for and the stream has none (docs/retention.md).
	Compress bool

	// Owner is the lease holder name of this bridge; unique per process.
	// Default "<hostname>-<pid>-<random hex>".
	Owner string
	// Lease is how long a claimed stream stays leased to this bridge (at
	// least 1 ms). Default 30 s.
	Lease time.Duration
	// ClaimLimit is how many streams one drain cycle claims. Default 100.
	ClaimLimit int
	// FetchLimit is how many events per stream one cycle fetches.
	// Default 500.
	FetchLimit int
	// PollInterval is the poll period when idle (LISTEN/NOTIFY usually
	// wakes the bridge sooner), and the discovery period of an
	// EventsTable. Default 1 s.
	PollInterval time.Duration
	// Linger is how long the drain waits, after a cycle that forwarded
	// events without finding a backlog, before it claims again, so one
	// cycle carries the events of many streams appended meanwhile instead
	// of three Postgres statements running for almost every event at a
	// steady rate (see drain.Config.Linger). The wait comes before the
	// cycle's acks, which go with the next claim in one transaction. An
	// event appended while the drain lingers waits up to Linger more; one
	// appended while it is idle does not. Default 0: claim again at once.
	Linger time.Duration
	// MaxRetries is how many failed attempts a stream may retry before it
	// is blocked. Default 10.
	MaxRetries int
	// MaxInFlight is how many streams are published concurrently (each
	// stream stays in order). Default 256.
	MaxInFlight int
	// PublishTimeout bounds one publish, from send to PubAck. At most 40 %
	// of Lease (MaxPublishTimeout): a larger value is lowered to it
	// with a warning. Default 5 s.
	PublishTimeout time.Duration
	// ShutdownGrace is how long the batch in flight may go on after Stop;
	// what it publishes is acked, the rest released. Default 10 s.
	ShutdownGrace time.Duration
	// SettleTimeout is how long an ack, retry or block may wait for a
	// stream's row that an application transaction holds (Postgres
	// lock_timeout). Default 5 s.
	SettleTimeout time.Duration
	// Migrate makes Start apply pending migrations of Schema first. Default
	// false: the application migrates (store.Store.Migrate, or `bridge
	// migrate`); `bridge run` sets it (--migrate, default true).
	Migrate bool
	// Logger receives the bridge's records (keys stream, event_id,
	// attempt, jetstream_stream). Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the bridge's Prometheus metrics
	// (jsbridge_bridge_*; see docs/observability.md). Default nil: no metrics.
	Registerer prometheus.Registerer
	// Metrics, when set, are metrics registered earlier with NewMetrics
	// (so a process exports the backlog gauges while it still waits for
	// NATS); New then registers nothing and Registerer is ignored.
	Metrics *Metrics
	// TracerProvider makes the publish spans: one per fast batch, linked
	// to the trace contexts in its events' meta, or one per event sent on
	// its own, a child of the trace context in its meta (traceparent,
	// tracestate) or starting a trace. Each message's traceparent header
	// carries the event's own trace context when it is batched and has
	// one, else its publish span's (see docs/observability.md, Tracing).
	// Default nil: otel's global tracer provider, a no-op until the
	// application installs an SDK.
	TracerProvider trace.TracerProvider
}

// Validate checks c without touching anything: nil, or an error wrapping
// ErrInvalidConfig that names the first bad field and its value (a
// negative duration or limit, a Lease below 1 ms, a Stream name JetStream
// refuses, a Schema that is not a plain lowercase identifier, an
// EventsTable that is not schema.table, a SubjectPrefix that is not a
// literal subject). New calls it.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns c with every zero field set to its default, or an
// error wrapping ErrInvalidConfig naming the first bad field and its value.
func (c Config) withDefaults() (Config, error) {
	checks := []struct {
		name string
		bad  bool
		val  any
	}{
		{"DuplicateWindow", c.DuplicateWindow < 0, c.DuplicateWindow},
		{"Lease", c.Lease < 0, c.Lease},
		{"Replicas", c.Replicas < 0, c.Replicas},
		{"MaxAge", c.MaxAge < 0, c.MaxAge},
		{"MaxBytes", c.MaxBytes < 0, c.MaxBytes},
		{"MaxMsgsPerSubject", c.MaxMsgsPerSubject < 0, c.MaxMsgsPerSubject},
		{"ClaimLimit", c.ClaimLimit < 0, c.ClaimLimit},
		{"FetchLimit", c.FetchLimit < 0, c.FetchLimit},
		{"PollInterval", c.PollInterval < 0, c.PollInterval},
		{"Linger", c.Linger < 0, c.Linger},
		{"MaxRetries", c.MaxRetries < 0, c.MaxRetries},
		{"MaxInFlight", c.MaxInFlight < 0, c.MaxInFlight},
		{"PublishTimeout", c.PublishTimeout < 0, c.PublishTimeout},
		{"ShutdownGrace", c.ShutdownGrace < 0, c.ShutdownGrace},
		{"SettleTimeout", c.SettleTimeout < 0, c.SettleTimeout},
	}
	for _, ch := range checks {
		if ch.bad {
			return c, fmt.Errorf("%w: Config.%s %v is negative", ErrInvalidConfig, ch.name, ch.val)
		}
	}
	if c.MaxAge > 0 && c.MaxAge < 100*time.Millisecond {
		return c, fmt.Errorf("%w: Config.MaxAge %v is below the 100ms JetStream accepts", ErrInvalidConfig, c.MaxAge)
	}
	if c.MaxAge > 0 && c.MaxAge < or(c.DuplicateWindow, DefaultDuplicateWindow) {
		return c, fmt.Errorf("%w: Config.MaxAge %v is shorter than Config.DuplicateWindow %v: JetStream refuses a duplicate window longer than the stream's MaxAge", ErrInvalidConfig, c.MaxAge, or(c.DuplicateWindow, DefaultDuplicateWindow))
	}
	if c.Lease > 0 && c.Lease < time.Millisecond {
		return c, fmt.Errorf("%w: Config.Lease %v is below 1ms", ErrInvalidConfig, c.Lease)
	}
	// The same characters forward.Provision refuses, checked here so that
	// New, not Start, says so.
	if strings.ContainsAny(c.Stream, ".*> \t\r\n/\\") {
		return c, fmt.Errorf("%w: Config.Stream %q: a JetStream stream name may not contain '.', '*', '>', whitespace or path separators", ErrInvalidConfig, c.Stream)
	}
	c.Schema = or(c.Schema, DefaultSchema)
	// The store's own checks, on a Store that is never used.
	if err := store.WithSchema(c.Schema)(&store.Store{}); err != nil {
		return c, fmt.Errorf("%w: Config.Schema %q: %v", ErrInvalidConfig, c.Schema, err)
	}
	if c.EventsTable != "" {
		if err := store.WithEventsTable(c.EventsTable)(&store.Store{}); err != nil {
			return c, fmt.Errorf("%w: Config.EventsTable %q: %v", ErrInvalidConfig, c.EventsTable, err)
		}
	}
	c.Stream = or(c.Stream, DefaultStream)
	c.SubjectPrefix = or(c.SubjectPrefix, DefaultSubjectPrefix)
	if err := wire.ValidatePrefix(c.SubjectPrefix); err != nil {
		return c, fmt.Errorf("%w: Config.SubjectPrefix %q: %v", ErrInvalidConfig, c.SubjectPrefix, err)
	}
	c.Source = or(c.Source, DefaultSource)
	c.DuplicateWindow = or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.Replicas = or(c.Replicas, DefaultReplicas)
	c.Lease = or(c.Lease, DefaultLease)
	c.ClaimLimit = or(c.ClaimLimit, DefaultClaimLimit)
	c.FetchLimit = or(c.FetchLimit, DefaultFetchLimit)
	c.PollInterval = or(c.PollInterval, DefaultPollInterval)
	c.MaxRetries = or(c.MaxRetries, DefaultMaxRetries)
	c.MaxInFlight = or(c.MaxInFlight, DefaultMaxInFlight)
	c.PublishTimeout = or(c.PublishTimeout, DefaultPublishTimeout)
	c.ShutdownGrace = or(c.ShutdownGrace, DefaultShutdownGrace)
	c.SettleTimeout = or(c.SettleTimeout, DefaultSettleTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// or returns v, or def when v is the zero value.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// limits is the retention of a stream Start creates.
func (c Config) limits() forward.Limits {
	return forward.Limits{MaxAge: c.MaxAge, MaxBytes: c.MaxBytes, MaxMsgsPerSubject: c.MaxMsgsPerSubject}
}
