// Package pgstore keeps a receiver's records in Postgres (pgx/v5), shared by
// every replica of a receiver and kept across restarts:
//
//   - Store is a webhook.IdempotencyStore: one row per Idempotency-Key. It
//     behaves exactly like webhook.MemoryStore (both run the suite in
//     webhook/idempotencytest) without the LRU bound: expired rows go with
//     Cleanup or RunCleanup.
//   - OrderStore is a webhook.OrderStore for an order gate: one row per
//     stream, locked while its next version is processed. It behaves
//     exactly like webhook.MemoryOrderStore (both run webhook/ordertest).
//
// It lives apart from package webhook so that a receiver not using Postgres
// does not link pgx.
package pgstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/webhook"
)

// DefaultTable is the table name unless WithTable says otherwise.
const DefaultTable = "webhook_idempotency"

// CleanupBatch is how many expired rows one DELETE of Cleanup removes, so a
// large backlog never holds locks on many rows at once.
const CleanupBatch = 10_000

// ErrInvalidOption is wrapped by New for an option with a bad value.
var ErrInvalidOption = errors.New("invalid option")

// Store is a webhook.IdempotencyStore over a pgxpool.Pool. It is safe for
// concurrent use. Build it with New and create its table with Migrate (or
// run MigrationSQL yourself).
//
// Table layout: key text primary key, done boolean (false: in progress),
// token text (the lease holder; "" when done), expires_at timestamptz (end
// of the lease or of the TTL), with an index on expires_at for Cleanup. A
// row whose expires_at has passed counts as absent. Claim is one INSERT …
// ON CONFLICT DO UPDATE … WHERE expires_at <= now, so concurrent claims of a
// key, from any number of processes, have one winner.
//
// Under an order gate over an OrderStore on the same pool, Claim, Complete
// and Release run in the request's transaction (see Tx) instead of on a
// connection of their own: the record commits with the stream's position
// and the handler's writes, or not at all, and a request needs one
// connection whatever the concurrency.
type Store struct {
	pool  *pgxpool.Pool
	table string // sanitized, schema-qualified when a schema was given
	index string // sanitized index name, unqualified
	now   func() time.Time
	log   *slog.Logger
}

// Option configures a Store in New.
type Option func(*Store) error

// WithTable sets the table as name or schema.name (default DefaultTable in
// the connection's search_path). Each part must be non-empty; it is quoted
// as an identifier.
func WithTable(name string) Option {
	return func(s *Store) error {
		parts := strings.Split(name, ".")
		if len(parts) > 2 {
			return fmt.Errorf("%w: table %q (want name or schema.name)", ErrInvalidOption, name)
		}
		for _, p := range parts {
			if p == "" {
				return fmt.Errorf("%w: table %q has an empty part", ErrInvalidOption, name)
			}
		}
		s.table = pgx.Identifier(parts).Sanitize()
		s.index = pgx.Identifier{parts[len(parts)-1] + "_expires_at_idx"}.Sanitize()
		return nil
	}
}

// WithClock measures leases and TTLs with now instead of the database clock
// (now() of each statement, the default, which every replica shares). For
// tests; with it, replicas' clocks must agree. now must not be nil.
func WithClock(now func() time.Time) Option {
	return func(s *Store) error {
		if now == nil {
			return fmt.Errorf("%w: clock is nil", ErrInvalidOption)
		}
		s.now = now
		return nil
	}
}

// WithLogger sets the logger RunCleanup reports failures to (default
// slog.Default()). l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) error {
		if l == nil {
			return fmt.Errorf("%w: logger is nil", ErrInvalidOption)
		}
		s.log = l
		return nil
	}
}

// New returns a Store using pool. It does not touch the database; call
// Migrate before use. Errors: a nil pool, or an option error wrapping
// ErrInvalidOption.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("new idempotency store: %w: pool is nil", ErrInvalidOption)
	}
	s := &Store{pool: pool, log: slog.Default()}
	if err := WithTable(DefaultTable)(s); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, fmt.Errorf("new idempotency store: %w", err)
		}
	}
	return s, nil
}

// MigrationSQL returns the idempotent DDL that Migrate runs: the table and
// its expires_at index.
func (s *Store) MigrationSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	key        text        PRIMARY KEY,
	done       boolean     NOT NULL,
	token      text        NOT NULL,
	expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + s.table + ` (expires_at);
`
}

// Migrate creates the table and index if they do not exist. It is safe to
// run on every start, from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	// Concurrent CREATE … IF NOT EXISTS can still collide on the catalog;
	// an advisory lock serializes them.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate idempotency table %s: %w", s.table, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "jsbridge.webhook.pgstore:"+s.table); err != nil {
		return fmt.Errorf("migrate idempotency table %s: lock: %w", s.table, err)
	}
	if _, err := tx.Exec(ctx, s.MigrationSQL()); err != nil {
		return fmt.Errorf("migrate idempotency table %s: %w", s.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate idempotency table %s: commit: %w", s.table, err)
	}
	return nil
}

// clock returns the time to pass as the statement's "now": nil means the
// database's now().
func (s *Store) clock() *time.Time {
	if s.now == nil {
		return nil
	}
	t := s.now()
	return &t
}

// maxClaimRounds bounds Claim's insert-then-read loop; each extra round means
// the record changed between the two statements (released or expired).
const maxClaimRounds = 10

// Claim implements webhook.IdempotencyStore.
func (s *Store) Claim(ctx context.Context, key string, lease time.Duration) (webhook.Claim, error) {
	if err := checkKey(ctx, "claim", key); err != nil {
		return webhook.Claim{}, err
	}
	if lease <= 0 {
		return webhook.Claim{}, fmt.Errorf("claim idempotency key %q: lease %v must be > 0", key, lease)
	}
	token := rand.Text() // 128 random bits
	claimSQL := `INSERT INTO ` + s.table + ` AS r (key, done, token, expires_at)
VALUES ($1, false, $2, coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE SET done = false, token = excluded.token, expires_at = excluded.expires_at
WHERE r.expires_at <= coalesce($3::timestamptz, now())`
	readSQL := `SELECT done, (extract(epoch FROM expires_at - coalesce($2::timestamptz, now())) * 1000000)::bigint
FROM ` + s.table + ` WHERE key = $1 AND expires_at > coalesce($2::timestamptz, now())`
	db := s.db(ctx)
	for range maxClaimRounds {
		now := s.clock()
		tag, err := db.Exec(ctx, claimSQL, key, token, now, lease.Microseconds())
		if err != nil {
			return webhook.Claim{}, fmt.Errorf("claim idempotency key %q: %w", key, err)
		}
		if tag.RowsAffected() == 1 {
			return webhook.Claim{Key: key, State: webhook.ClaimWon, Token: token, Remaining: lease}, nil
		}
		var done bool
		var remainingMicros int64
		err = db.QueryRow(ctx, readSQL, key, now).Scan(&done, &remainingMicros)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released or expired since the insert: claim again
		}
		if err != nil {
			return webhook.Claim{}, fmt.Errorf("claim idempotency key %q: read holder: %w", key, err)
		}
		c := webhook.Claim{Key: key, State: webhook.ClaimInProgress, Remaining: time.Duration(remainingMicros) * time.Microsecond}
		if done {
			c.State = webhook.ClaimDone
		}
		return c, nil
	}
	return webhook.Claim{}, fmt.Errorf("claim idempotency key %q: record kept changing over %d rounds", key, maxClaimRounds)
}

// Complete implements webhook.IdempotencyStore.
func (s *Store) Complete(ctx context.Context, c webhook.Claim, ttl time.Duration) error {
	if err := checkKey(ctx, "complete", c.Key); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("complete idempotency key %q: ttl %v must be > 0", c.Key, ttl)
	}
	_, err := s.db(ctx).Exec(ctx, `INSERT INTO `+s.table+` (key, done, token, expires_at)
VALUES ($1, true, '', coalesce($2::timestamptz, now()) + $3 * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE SET done = true, token = '', expires_at = excluded.expires_at`,
		c.Key, s.clock(), ttl.Microseconds())
	if err != nil {
		return fmt.Errorf("complete idempotency key %q: %w", c.Key, err)
	}
	return nil
}

// Release implements webhook.IdempotencyStore.
func (s *Store) Release(ctx context.Context, c webhook.Claim) error {
	if err := checkKey(ctx, "release", c.Key); err != nil {
		return err
	}
	if c.Token == "" {
		return nil // not a lease holder: nothing of ours to release
	}
	if _, err := s.db(ctx).Exec(ctx, `DELETE FROM `+s.table+` WHERE key = $1 AND NOT done AND token = $2`, c.Key, c.Token); err != nil {
		return fmt.Errorf("release idempotency key %q: %w", c.Key, err)
	}
	return nil
}

// Cleanup deletes the expired rows (leases and TTLs that have passed), in
// batches of CleanupBatch, and returns how many it deleted. A row claimed
// again while Cleanup runs is kept. Expired rows already count as absent;
// Cleanup only reclaims space.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	// expires_at is checked again in the outer WHERE so that a row re-claimed
	// between the subquery and the delete (Postgres re-checks the qual on the
	// new row version) survives.
	q := `DELETE FROM ` + s.table + ` WHERE expires_at <= coalesce($1::timestamptz, now()) AND key IN (
	SELECT key FROM ` + s.table + ` WHERE expires_at <= coalesce($1::timestamptz, now()) LIMIT $2)`
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, q, s.clock(), CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("clean up idempotency table %s: %w", s.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < CleanupBatch {
			return total, nil
		}
	}
}

// RunCleanup calls Cleanup every interval until ctx is done, then returns
// nil. Failures are logged (key "err") and retried at the next tick.
// interval must be positive.
func (s *Store) RunCleanup(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("run idempotency cleanup: %w: interval %v (must be > 0)", ErrInvalidOption, interval)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		n, err := s.Cleanup(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.ErrorContext(ctx, "webhook: idempotency cleanup", "err", err)
		case n > 0:
			s.log.DebugContext(ctx, "webhook: idempotency cleanup", "deleted", n)
		}
	}
}

func checkKey(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s idempotency key %q: %w", op, key, err)
	}
	if key == "" {
		return fmt.Errorf("%s idempotency key: %w: key is empty", op, webhook.ErrInvalidKey)
	}
	return nil
}
