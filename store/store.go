// Package store is the Postgres side of jsbridge: the schema and its
// migrations, appending events with optimistic concurrency, the per-stream
// leases and watermarks the drain claims and settles, LISTEN/NOTIFY wake-ups
// and the operator queries behind the bridge's CLI.
//
// Every table lives in one schema ("jsbridge" by default); the SQL is written
// once in sql.go with that schema injected.
package store

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is the schema the store uses when WithSchema is not given.
const DefaultSchema = "jsbridge"

// ErrInvalidInput is wrapped by every error about a bad argument (option,
// stream name, event, filter); the message names the field and the value.
var ErrInvalidInput = errors.New("invalid input")

// Store is the Postgres event store and the bridge's per-stream state. It is
// safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	schema string
	q      queries
}

// Option configures a Store.
type Option func(*Store) error

// plainIdent is an unquoted Postgres identifier that folds to itself: it can
// be spliced into SQL and used as a NOTIFY channel name unchanged.
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithSchema sets the schema holding the store's tables (default
// DefaultSchema, "jsbridge"). The name must be a plain lowercase identifier
// ([a-z_][a-z0-9_]*, at most 63 bytes); it is also the LISTEN/NOTIFY channel.
// Any other name gives an error wrapping ErrInvalidInput.
func WithSchema(name string) Option {
	return func(s *Store) error {
		if !plainIdent.MatchString(name) {
			return fmt.Errorf("%w: schema %q is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", ErrInvalidInput, name)
		}
		s.schema = name
		return nil
	}
}

// New returns a Store on pool. It does not touch the database; call Migrate
// before first use. pool must not be nil.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidInput)
	}
	s := &Store{pool: pool, schema: DefaultSchema}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	s.q = newQueries(s.schema)
	return s, nil
}

// Schema returns the schema name the store uses (also its NOTIFY channel).
func (s *Store) Schema() string { return s.schema }
