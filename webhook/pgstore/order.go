package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/webhook"
)

// DefaultOrderTable is the OrderStore's table unless WithOrderTable says
// otherwise.
const DefaultOrderTable = "webhook_order"

// OrderStore is a webhook.OrderStore over a pgxpool.Pool: one row per
// stream, shared by every replica of a receiver and kept across restarts.
// It behaves exactly like webhook.MemoryOrderStore (both run the suite in
// webhook/ordertest). Build it with NewOrderStore and create its table with
// Migrate (or run MigrationSQL yourself).
//
// Table layout: namespace, source, stream text (the primary key),
// version bigint (last processed; -1 for none), epoch numeric(20,0) (a
// uint64), partition integer (-1 for none), updated_at timestamptz. Rows
// never expire: a stream's position must outlive every redelivery of it.
//
// Lock holds the stream's row with SELECT … FOR UPDATE NOWAIT in a
// transaction that stays open while the gated handler runs, and Advance
// updates the row and commits: requests of one stream, from any number of
// receiver replicas, are processed one at a time, and a receiver that dies
// mid-handler releases the row with its connection (a lease could expire
// under a handler still running, and let v+1 overlap v). NOWAIT never
// waits: a held row is reported at once, and the gate answers 409.
//
// That transaction is the request's (see Tx): a Store on the same pool
// keeps the Idempotency-Key's record in it and the handler can write its
// own effects in it, so everything commits together with the position.
// Each request being processed therefore holds exactly one pool
// connection and waits for no other, so any pool size works at any
// concurrency: requests beyond MaxConns wait for a connection (bounded by
// the request's context), never for each other. Size the pool to the
// ordered requests you want processed at once (the senders' max_in_flight
// per replica times the consumer replicas, at most).
type OrderStore struct {
	pool  *pgxpool.Pool
	table string // sanitized, schema-qualified when a schema was given
}

// OrderOption configures an OrderStore in NewOrderStore.
type OrderOption func(*OrderStore) error

// WithOrderTable sets the table as name or schema.name (default
// DefaultOrderTable in the connection's search_path). Each part must be
// non-empty; it is quoted as an identifier.
func WithOrderTable(name string) OrderOption {
	return func(s *OrderStore) error {
		parts := strings.Split(name, ".")
		if len(parts) > 2 {
			return fmt.Errorf("%w: order table %q (want name or schema.name)", ErrInvalidOption, name)
		}
		for _, p := range parts {
			if p == "" {
				return fmt.Errorf("%w: order table %q has an empty part", ErrInvalidOption, name)
			}
		}
		s.table = pgx.Identifier(parts).Sanitize()
		return nil
	}
}

// NewOrderStore returns an OrderStore using pool. It does not touch the
// database; call Migrate before use. Errors: a nil pool, or an option error
// wrapping ErrInvalidOption.
func NewOrderStore(pool *pgxpool.Pool, opts ...OrderOption) (*OrderStore, error) {
	if pool == nil {
		return nil, fmt.Errorf("new order store: %w: pool is nil", ErrInvalidOption)
	}
	s := &OrderStore{pool: pool}
	if err := WithOrderTable(DefaultOrderTable)(s); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, fmt.Errorf("new order store: %w", err)
		}
	}
	return s, nil
}

// MigrationSQL returns the idempotent DDL that Migrate runs.
func (s *OrderStore) MigrationSQL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	namespace  text           NOT NULL,
	source     text           NOT NULL,
	stream     text           NOT NULL,
	version    bigint         NOT NULL,
	epoch      numeric(20, 0) NOT NULL,
	partition  integer        NOT NULL,
	updated_at timestamptz    NOT NULL DEFAULT now(),
	PRIMARY KEY (namespace, source, stream)
);
`
}

// Migrate creates the table if it does not exist. It is safe to run on
// every start, from several processes at once.
func (s *OrderStore) Migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate order table %s: %w", s.table, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "jsbridge.webhook.pgstore:"+s.table); err != nil {
		return fmt.Errorf("migrate order table %s: lock: %w", s.table, err)
	}
	if _, err := tx.Exec(ctx, s.MigrationSQL()); err != nil {
		return fmt.Errorf("migrate order table %s: %w", s.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate order table %s: commit: %w", s.table, err)
	}
	return nil
}

// lockNotAvailable is SQLSTATE 55P03, what FOR UPDATE NOWAIT fails with
// on a row another transaction holds.
const lockNotAvailable = "55P03"

// Lock implements webhook.OrderStore. A stream's row is created (as
// unprocessed) by a statement of its own before it is locked, so no
// transaction ever holds an uncommitted row another one would wait for.
func (s *OrderStore) Lock(ctx context.Context, key webhook.OrderKey) (webhook.OrderPosition, webhook.OrderLock, error) {
	if err := ctx.Err(); err != nil {
		return webhook.OrderPosition{}, nil, fmt.Errorf("lock %s: %w", key, err)
	}
	lockSQL := `SELECT version, epoch, partition FROM ` + s.table + `
WHERE namespace = $1 AND source = $2 AND stream = $3 FOR UPDATE NOWAIT`
	createSQL := `INSERT INTO ` + s.table + ` (namespace, source, stream, version, epoch, partition)
VALUES ($1, $2, $3, -1, 0, -1) ON CONFLICT DO NOTHING`
	for range 2 {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return webhook.OrderPosition{}, nil, fmt.Errorf("lock %s: %w", key, err)
		}
		var pos webhook.OrderPosition
		err = tx.QueryRow(ctx, lockSQL, key.Namespace, key.Source, key.Stream).Scan(&pos.Version, &pos.Epoch, &pos.Partition)
		if err == nil {
			return pos, &orderLock{tx: tx, pool: s.pool, key: key, from: pos, table: s.table}, nil
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
			pos, err := s.Position(ctx, key)
			return pos, nil, err
		case errors.Is(err, pgx.ErrNoRows):
			if _, err := s.pool.Exec(ctx, createSQL, key.Namespace, key.Source, key.Stream); err != nil {
				return webhook.OrderPosition{}, nil, fmt.Errorf("lock %s: create its row: %w", key, err)
			}
		default:
			return webhook.OrderPosition{}, nil, fmt.Errorf("lock %s: %w", key, err)
		}
	}
	return webhook.OrderPosition{}, nil, fmt.Errorf("lock %s: its row vanished after it was created", key)
}

// Position implements webhook.OrderStore.
func (s *OrderStore) Position(ctx context.Context, key webhook.OrderKey) (webhook.OrderPosition, error) {
	if err := ctx.Err(); err != nil {
		return webhook.OrderPosition{}, fmt.Errorf("read %s: %w", key, err)
	}
	var pos webhook.OrderPosition
	err := s.pool.QueryRow(ctx, `SELECT version, epoch, partition FROM `+s.table+`
WHERE namespace = $1 AND source = $2 AND stream = $3`, key.Namespace, key.Source, key.Stream).Scan(&pos.Version, &pos.Epoch, &pos.Partition)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return webhook.Unprocessed, nil
	case err != nil:
		return webhook.OrderPosition{}, fmt.Errorf("read %s: %w", key, err)
	}
	return pos, nil
}

// orderLock is a stream's row held FOR UPDATE by tx, the request's
// transaction.
type orderLock struct {
	tx    pgx.Tx
	pool  *pgxpool.Pool
	key   webhook.OrderKey
	from  webhook.OrderPosition
	table string
	ended bool
}

// WithLock implements webhook.ContextOrderLock: the gated handler's
// context carries the transaction (Tx).
func (l *orderLock) WithLock(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &requestTx{tx: l.tx, pool: l.pool})
}

func (l *orderLock) Advance(ctx context.Context, pos webhook.OrderPosition) error {
	if l.ended {
		return fmt.Errorf("advance %s: %w: the lock has ended", l.key, webhook.ErrOrderAdvance)
	}
	l.ended = true
	if err := webhook.CheckOrderAdvance(l.key, l.from, pos); err != nil {
		_ = l.tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	_, err := l.tx.Exec(ctx, `UPDATE `+l.table+` SET version = $4, epoch = $5, partition = $6, updated_at = now()
WHERE namespace = $1 AND source = $2 AND stream = $3`, l.key.Namespace, l.key.Source, l.key.Stream, pos.Version, pos.Epoch, pos.Partition)
	if err == nil {
		err = l.tx.Commit(ctx)
	}
	if err != nil {
		_ = l.tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("advance %s to version %d: %w", l.key, pos.Version, err)
	}
	return nil
}

func (l *orderLock) Release(ctx context.Context) error {
	if l.ended {
		return nil
	}
	l.ended = true
	if err := l.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("release %s: %w", l.key, err)
	}
	return nil
}
