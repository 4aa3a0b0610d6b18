package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

func TestPostgresPermanent(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"28P01": true,  // password authentication failed
		"28000": true,  // invalid authorization specification (pg_hba.conf)
		"3D000": true,  // database does not exist
		"42501": true,  // insufficient privilege
		"57P03": false, // the database system is starting up
		"53300": false, // too many connections
		"08006": false, // connection failure
		"42P01": false, // undefined table: another program may create it
	} {
		err := fmt.Errorf("connect: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, postgresPermanent(err), code)
		require.Equal(t, want, startup.IsPermanent(postgresErr(err)), code)
	}
	require.False(t, postgresPermanent(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")))
	require.NoError(t, postgresErr(nil))

	// An external events table: a wrong layout is for a person to fix, a
	// table not created yet by its program is waited for.
	require.True(t, startup.IsPermanent(postgresErr(fmt.Errorf("migrate: %w: column data is bytea", store.ErrEventsTableLayout))))
	require.False(t, startup.IsPermanent(postgresErr(fmt.Errorf("migrate: %w: app.events", store.ErrEventsTableMissing))))
}

// A database that does not exist is reported at once, naming it; a server
// that is not there is waited for.
func TestWaitPostgres(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	u.Path = "/no_such_database_jsbridge"
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	defer pool.Close()
	w := startup.New(nil, 0)
	err = waitPostgres(context.Background(), w, pool)
	require.True(t, startup.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, `database "no_such_database_jsbridge" does not exist`)
	require.ErrorContains(t, err, "--database-url")

	down, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	defer down.Close()
	w = startup.New(nil, 300*time.Millisecond)
	err = waitPostgres(context.Background(), w, down)
	require.ErrorIs(t, err, startup.ErrTimeout)
	require.ErrorContains(t, err, "waiting for Postgres at 127.0.0.1:1/x")
}
