// Package pgtest gives tests a real Postgres: the database named by
// JSBRIDGE_TEST_DATABASE_URL, or else the project's throwaway local server,
// which it starts (or reuses) with scripts/pg. It never skips: when no server
// can be had, the test fails and says why.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL is the environment variable naming the test database.
const EnvURL = "JSBRIDGE_TEST_DATABASE_URL"

var (
	urlOnce sync.Once
	url     string
	urlErr  error
)

// URL returns the test database URL, starting the local throwaway Postgres
// with scripts/pg when JSBRIDGE_TEST_DATABASE_URL is unset.
func URL(t testing.TB) string {
	t.Helper()
	u, err := LookupURL()
	if err != nil {
		t.Fatalf("pgtest: no Postgres: set %s or fix scripts/pg start: %v", EnvURL, err)
	}
	return u
}

// LookupURL is URL for code without a testing.TB (Example functions): the
// same database, or the error URL would fail the test with.
func LookupURL() (string, error) {
	urlOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			url = u
			return
		}
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "pg")
		cmd := exec.Command(script, "start")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			urlErr = err
			return
		}
		url = strings.TrimSpace(string(out))
	})
	return url, urlErr
}

// Pool returns a connection pool to the test database, closed at cleanup.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("pgtest: parse url: %v", err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates an empty schema with a fresh name for one test and drops it
// (cascading) at cleanup, so parallel tests never see each other's rows.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
	})
	return name
}

// SchemaShape describes what makes up a schema: its columns, indexes,
// triggers, relations and functions, as one string. Tests compare it before
// and after an operation to show the operation changed none of it.
func SchemaShape(t testing.TB, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var out string
	err := pool.QueryRow(context.Background(), `SELECT concat_ws(E'\n',
    (SELECT string_agg(column_name || ' ' || data_type || ' ' || coalesce(column_default, ''), ', ' ORDER BY ordinal_position)
       FROM information_schema.columns WHERE table_schema = $1),
    (SELECT string_agg(indexdef, ', ' ORDER BY indexname) FROM pg_indexes WHERE schemaname = $1),
    (SELECT count(*) FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1)::text,
    (SELECT string_agg(c.relname || ':' || c.relkind::text, ', ' ORDER BY c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1),
    (SELECT string_agg(p.proname, ', ') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1))`, schema).Scan(&out)
	if err != nil {
		t.Fatalf("pgtest: shape of schema %s: %v", schema, err)
	}
	return out
}
