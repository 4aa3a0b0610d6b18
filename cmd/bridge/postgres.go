package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/store"
)

// pingTimeout bounds one attempt to reach Postgres: a host that drops
// packets would otherwise hold the attempt for the OS's TCP timeout.
const pingTimeout = 10 * time.Second

// waitPostgres waits with w until Postgres answers on pool; refused
// credentials and a missing database are permanent (postgresPermanent).
func waitPostgres(ctx context.Context, w *startup.Waiter, pool *pgxpool.Pool) error {
	cc := pool.Config().ConnConfig
	where := fmt.Sprintf("Postgres at %s:%d/%s", cc.Host, cc.Port, cc.Database)
	return w.For(ctx, where, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, pingTimeout)
		defer cancel()
		if err := postgresErr(pool.Ping(ctx)); err != nil {
			if startup.IsPermanent(err) {
				return fmt.Errorf("connect to %s: %w (waiting cannot fix this: check --database-url)", where, err)
			}
			return err
		}
		return nil
	})
}

// postgresErr returns err marked startup.Permanent when postgresPermanent
// says waiting cannot fix it, else err unchanged (nil stays nil).
func postgresErr(err error) error {
	if err != nil && (postgresPermanent(err) || errors.Is(err, store.ErrEventsTableLayout) || errors.Is(err, store.ErrInvalidInput) || errors.Is(err, store.ErrInvalidConfig)) {
		return startup.Permanent(err)
	}
	return err
}

// postgresPermanent reports whether err, from connecting to Postgres or
// migrating, is one waiting cannot fix: the server refused the credentials
// (SQLSTATE class 28: 28P01 password authentication failed, 28000 invalid
// authorization specification such as no pg_hba.conf entry), the database
// does not exist (3D000), or the role lacks a privilege the bridge needs
// (42501, e.g. to create its schema). Everything else (a refused or
// dropped connection, the server starting up or shutting down, 57P03,
// too many connections, a table another program has not created yet) is
// waited for.
func postgresPermanent(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000" || pgErr.Code == "42501"
}
