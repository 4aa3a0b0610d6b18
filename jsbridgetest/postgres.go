package jsbridgetest

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

// EnvDatabaseURL is the environment variable naming the test database: a
// Postgres URL whose user may create schemas.
const EnvDatabaseURL = "JSBRIDGE_TEST_DATABASE_URL"

var (
	urlOnce sync.Once
	url     string
	urlErr  error
)

// DatabaseURL returns the test database's URL: $JSBRIDGE_TEST_DATABASE_URL,
// or else (inside the jsbridge repository) the throwaway local Postgres
// that scripts/pg starts or reuses. It never skips: with no database the
// test fails and says why.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u, err := LookupDatabaseURL()
	if err != nil {
		t.Fatalf("jsbridgetest: no Postgres: set %s (or, in the jsbridge repository, fix scripts/pg start): %v", EnvDatabaseURL, err)
	}
	return u
}

// LookupDatabaseURL is DatabaseURL for code without a testing.TB (Example
// functions, TestMain): the same URL, or the error DatabaseURL fails with.
func LookupDatabaseURL() (string, error) {
	urlOnce.Do(func() {
		if u := os.Getenv(EnvDatabaseURL); u != "" {
			url = u
			return
		}
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "scripts", "pg")
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

// Pool returns a pool of at most 8 connections to the test database,
// closed at the test's cleanup.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DatabaseURL(t))
	if err != nil {
		t.Fatalf("jsbridgetest: parse database url: %v", err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("jsbridgetest: connect to Postgres: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates an empty schema with a fresh name ("t_" and 12 hex
// digits) for one test and drops it, cascading, at cleanup, so parallel
// tests never see each other's rows.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("jsbridgetest: create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
	})
	return name
}

// SchemaShape describes what makes up schema (its columns, indexes,
// triggers, relations and functions) as one string: compare it before and
// after an operation to show the operation changed none of it.
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
		t.Fatalf("jsbridgetest: shape of schema %s: %v", schema, err)
	}
	return out
}
