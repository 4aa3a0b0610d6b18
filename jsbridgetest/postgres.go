package jsbridgetest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/internal/pgtest"
)

// EnvDatabaseURL is the environment variable naming the test database: a
// Postgres URL whose user may create schemas.
const EnvDatabaseURL = pgtest.EnvURL

// DatabaseURL returns the test database's URL: $JSBRIDGE_TEST_DATABASE_URL,
// or else (inside the jsbridge repository) the throwaway local Postgres
// that scripts/pg starts or reuses. It never skips: with no database the
// test fails and says why.
func DatabaseURL(t testing.TB) string { t.Helper(); return pgtest.URL(t) }

// LookupDatabaseURL is DatabaseURL for code without a testing.TB (Example
// functions, TestMain): the same URL, or the error DatabaseURL fails with.
func LookupDatabaseURL() (string, error) { return pgtest.LookupURL() }

// Pool returns a pool of at most 8 connections to the test database,
// closed at the test's cleanup.
func Pool(t testing.TB) *pgxpool.Pool { t.Helper(); return pgtest.Pool(t) }

// Schema creates an empty schema with a fresh name ("t_" and 12 hex
// digits) for one test and drops it, cascading, at cleanup, so parallel
// tests never see each other's rows.
func Schema(t testing.TB, pool *pgxpool.Pool) string { t.Helper(); return pgtest.Schema(t, pool) }

// SchemaShape describes what makes up schema (its columns, indexes,
// triggers, relations and functions) as one string: compare it before and
// after an operation to show the operation changed none of it.
func SchemaShape(t testing.TB, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	return pgtest.SchemaShape(t, pool, schema)
}
