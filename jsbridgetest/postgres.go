package jsbridgetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

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
// or else (inside a jsbridge checkout only) the throwaway local Postgres
// that the checkout's scripts/pg starts or reuses. It never skips: with no
// database the test fails and says what to set.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u, err := LookupDatabaseURL()
	if err != nil {
		t.Fatalf("jsbridgetest: no Postgres: %v", err)
	}
	return u
}

// LookupDatabaseURL is DatabaseURL for code without a testing.TB (Example
// functions, TestMain): the same URL, or the error DatabaseURL fails with.
func LookupDatabaseURL() (string, error) {
	urlOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		url, urlErr = lookupDatabaseURL(os.Getenv(EnvDatabaseURL), filepath.Join(filepath.Dir(file), ".."))
	})
	return url, urlErr
}

// lookupDatabaseURL returns env when set; else, when root (the directory
// above this package) is a jsbridge checkout (it holds .git and an
// executable scripts/pg), the URL scripts/pg start prints. Anywhere else
// (the module cache of an application's build) it says what to set.
func lookupDatabaseURL(env, root string) (string, error) {
	if env != "" {
		return env, nil
	}
	script := filepath.Join(root, "scripts", "pg")
	st, err := os.Stat(script)
	_, gitErr := os.Stat(filepath.Join(root, ".git"))
	if err != nil || st.Mode()&0o111 == 0 || gitErr != nil {
		return "", fmt.Errorf("set %s to the URL of a Postgres whose user may create schemas "+
			"(e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable); each test makes and drops a schema of its own "+
			"(only a jsbridge checkout starts a throwaway Postgres by itself, with its scripts/pg)", EnvDatabaseURL)
	}
	cmd := exec.Command(script, "start")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s start failed (%w; its output is above), and %s is not set: set it to a Postgres URL, or see why the script failed", script, err, EnvDatabaseURL)
	}
	return strings.TrimSpace(string(out)), nil
}

// poolCloseWait bounds how long Pool's cleanup waits for the pool to
// close: pgxpool's Close waits for every acquired connection to come
// back, and a bridge or consumer the test left running holds one (its
// LISTEN connection) until it is stopped.
const poolCloseWait = 30 * time.Second

// Pool returns a pool of at most 8 connections to the test database,
// closed at the test's cleanup. A close still waiting after 30 s (a
// connection still acquired: a part the test started and did not stop,
// usually because the test failed before its Stop) fails the test
// saying so instead of hanging it, and leaves the pool to the process.
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
	t.Cleanup(func() {
		closed := make(chan struct{})
		go func() {
			pool.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(poolCloseWait):
			t.Errorf("jsbridgetest: the test pool did not close within %s: %d connection(s) still acquired; "+
				"stop every bridge and consumer the test started (t.Cleanup right after Start) before the pool closes",
				poolCloseWait, pool.Stat().AcquiredConns())
		}
	})
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
