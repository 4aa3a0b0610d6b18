// Package store is the Postgres side of jsbridge: the schema and its
// migrations, appending events with optimistic concurrency, the per-stream
// leases and watermarks the drain claims and settles, LISTEN/NOTIFY wake-ups
// and the operator queries behind the bridge's CLI.
//
// Every table of the bridge lives in one schema ("jsbridge" by default); the
// SQL is written once in sql.go with that schema injected. The events are in
// the bridge's own table <schema>.events, whose trigger keeps each stream's
// head current, or in an existing table another program writes
// (WithEventsTable), whose new events the store discovers by polling.
package store

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is the schema the store uses when WithSchema is not given.
const DefaultSchema = "jsbridge"

// ErrInvalidInput is wrapped by every error about a bad argument of a
// call (stream name, event, filter); the message names the argument and
// the value.
var ErrInvalidInput = errors.New("invalid input")

// ErrInvalidConfig is wrapped by every error about a bad option of New
// (or MigrationSQL); the message names the option and the value
// (`WithSettleTimeout 0s: want > 0`).
var ErrInvalidConfig = errors.New("invalid store config")

// Store is the Postgres event store and the bridge's per-stream state. It is
// safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	schema string
	q      queries

	// eventsTable is the events table as given (schema.table); "" means the
	// bridge's own <schema>.events.
	eventsTable       string
	eventsIdent       pgx.Identifier
	discoveryInterval time.Duration
	discoverySpan     int64
	settleTimeout     time.Duration
	log               *slog.Logger

	// lastFetch is how many events the last Fetch returned: the next one
	// makes room for about as many up front (see Fetch).
	lastFetch atomic.Int64
	// notes is the open Notifications channel, which Claim also wakes.
	notes wakeups
	// listening are the open Notifications channels, each with its
	// listening session and its claim on the idle lock (Idle, Busy).
	listening listeners
	// markers is the vacuum of the marker table the folds keep (fold.go).
	markers markerVacuum
}

// Option configures a Store.
type Option func(*Store) error

// plainIdent is an unquoted Postgres identifier that folds to itself: it can
// be spliced into SQL and used as a NOTIFY channel name unchanged.
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithSchema sets the schema holding the store's tables (default
// DefaultSchema, "jsbridge"). The name must be a plain lowercase identifier
// ([a-z_][a-z0-9_]*, at most 63 bytes); it is also the LISTEN/NOTIFY channel.
// Any other name gives an error wrapping ErrInvalidConfig.
func WithSchema(name string) Option {
	return func(s *Store) error {
		if !plainIdent.MatchString(name) {
			return fmt.Errorf("%w: WithSchema %q: not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", ErrInvalidConfig, name)
		}
		s.schema = name
		return nil
	}
}

// DefaultDiscoveryInterval is how often an external events table is polled
// for new events when WithDiscoveryInterval is not given.
const DefaultDiscoveryInterval = time.Second

// defaultDiscoverySpan is how many ids past the last scan one discovery
// statement reads at most, so catching up on a large existing table goes in
// bounded steps.
const defaultDiscoverySpan = 10_000

// WithEventsTable makes the store drain an existing events table that
// another program writes, named "schema.table" (each part an identifier,
// quoted as needed), instead of the bridge's own <schema>.events. The table
// must have the common layout: id bigint (unique, increasing, drawn from a
// sequence or identity column when the row is inserted), stream text,
// version bigint (0-based per stream), name text, data jsonb, meta jsonb,
// created timestamptz. The store never changes that table: Migrate creates
// only the bridge's own objects, and new events are discovered by polling
// (see Discover), not by a trigger. A name without exactly one dot, or with
// an empty part, gives an error wrapping ErrInvalidConfig.
func WithEventsTable(name string) Option {
	return func(s *Store) error {
		schema, table, ok := strings.Cut(name, ".")
		if !ok || schema == "" || table == "" || strings.Contains(table, ".") {
			return fmt.Errorf("%w: WithEventsTable %q: not schema.table", ErrInvalidConfig, name)
		}
		s.eventsTable = name
		s.eventsIdent = pgx.Identifier{schema, table}
		return nil
	}
}

// WithDiscoveryInterval sets how often Notifications polls an external
// events table (WithEventsTable) for new events (default
// DefaultDiscoveryInterval, 1s). It has no effect on the bridge's own events
// table, whose trigger notifies. d must be > 0 (error wrapping
// ErrInvalidConfig).
func WithDiscoveryInterval(d time.Duration) Option {
	return func(s *Store) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithDiscoveryInterval %s: want > 0", ErrInvalidConfig, d)
		}
		s.discoveryInterval = d
		return nil
	}
}

// DefaultSettleTimeout bounds one ack, retry, block or release when
// WithSettleTimeout is not given.
const DefaultSettleTimeout = 5 * time.Second

// WithSettleTimeout bounds each ack, retry, block and release statement
// (default DefaultSettleTimeout, 5s). The application's append holds its
// stream's row in the streams table until it commits (the trigger moves the
// head), and a settle of that stream waits for it; past d the statement is
// cancelled and the settle fails with an error wrapping ErrSettleTimeout, so
// a long application transaction cannot stall a drain cycle (the stream's
// lease then runs out and it is claimed again). The bridge never makes an
// application commit wait longer than one of its own short statements. d
// must be > 0 (error wrapping ErrInvalidConfig).
func WithSettleTimeout(d time.Duration) Option {
	return func(s *Store) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithSettleTimeout %s: want > 0", ErrInvalidConfig, d)
		}
		s.settleTimeout = d
		return nil
	}
}

// ErrSettleTimeout is wrapped by a settle that was cancelled after the
// settle timeout (WithSettleTimeout), typically waiting for an application
// transaction that holds the stream's row.
var ErrSettleTimeout = errors.New("settle timed out waiting for the stream's row")

// WithLogger sets the logger for background work (discovery errors).
// Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger: logger is nil", ErrInvalidConfig)
		}
		s.log = l
		return nil
	}
}

// New returns a Store on pool. It does not touch the database; call Migrate
// before first use. pool must not be nil. Errors wrap ErrInvalidConfig.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	s, err := newStore(opts)
	if err != nil {
		return nil, err
	}
	s.pool = pool
	return s, nil
}

func newStore(opts []Option) (*Store, error) {
	s := &Store{schema: DefaultSchema, discoveryInterval: DefaultDiscoveryInterval, discoverySpan: defaultDiscoverySpan, settleTimeout: DefaultSettleTimeout, log: slog.Default()}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	events := s.schema + ".events"
	if s.eventsTable != "" {
		events = s.eventsIdent.Sanitize()
	}
	s.q = newQueries(s.schema, events)
	s.markers.every = markerVacuumEvery
	s.markers.sql = "VACUUM (SKIP_LOCKED, TRUNCATE false) " + s.schema + ".appended"
	return s, nil
}

// External reports whether the store drains an existing events table
// (WithEventsTable) rather than its own.
func (s *Store) External() bool { return s.eventsTable != "" }

// EventsTable returns the events table the store reads, schema-qualified.
func (s *Store) EventsTable() string {
	if s.eventsTable != "" {
		return s.eventsTable
	}
	return s.schema + ".events"
}

// Schema returns the schema name the store uses (also its NOTIFY channel).
func (s *Store) Schema() string { return s.schema }
