package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Postgres as the live pipeline rows measure it: pg_stat_statements made
// to count, the statement time of the appends against the rest, and the
// CPU of the backends of one application_name.

// ensureStatements makes pg_stat_statements count: on the bench's own
// throwaway Postgres (no -database-url) it preloads the library (ALTER
// SYSTEM and a restart with scripts/pg) when it is not, then creates the
// extension in the database. With -database-url it only creates the
// extension, and fails when the server does not preload it.
func (e *env) ensureStatements(ctx context.Context) error {
	var libs string
	if err := e.pool.QueryRow(ctx, "SHOW shared_preload_libraries").Scan(&libs); err != nil {
		return err
	}
	if !strings.Contains(libs, "pg_stat_statements") {
		if e.cfg.DatabaseURL != "" {
			return fmt.Errorf("the server at -database-url does not preload it (shared_preload_libraries %q)", libs)
		}
		want := "pg_stat_statements"
		if strings.TrimSpace(libs) != "" {
			want = libs + ",pg_stat_statements"
		}
		if _, err := e.pool.Exec(ctx, "ALTER SYSTEM SET shared_preload_libraries = '"+strings.ReplaceAll(want, "'", "''")+"'"); err != nil {
			return err
		}
		fmt.Println("bench: live pipeline: restarting the throwaway Postgres to preload pg_stat_statements")
		script := filepath.Join(e.cfg.Repo, "scripts", "pg")
		for _, step := range []string{"stop", "start"} {
			if out, err := exec.Command(script, step).CombinedOutput(); err != nil {
				return fmt.Errorf("scripts/pg %s: %w: %s", step, err, out)
			}
		}
		e.pool.Reset()
	}
	_, err := e.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	return err
}

// statementTimes is pg_stat_statements' total execution time of the
// appends' INSERT and of every other statement of the database.
func (e *env) statementTimes(ctx context.Context) (appends, other time.Duration, err error) {
	var a, o float64 // ms
	err = e.pool.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%INSERT INTO%(stream, version, name, data, meta)%'), 0),
       coalesce(sum(total_exec_time) FILTER (WHERE query NOT LIKE '%INSERT INTO%(stream, version, name, data, meta)%'), 0)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&a, &o)
	return time.Duration(a * float64(time.Millisecond)), time.Duration(o * float64(time.Millisecond)), err
}

// sessionCPU is the CPU the backends of the sessions named app
// (application_name) have used so far: 0 when Postgres runs elsewhere.
func (e *env) sessionCPU(ctx context.Context, app string) time.Duration {
	rows, err := e.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		return 0
	}
	defer rows.Close()
	var sum time.Duration
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			sum += mustCPU(pid)
		}
	}
	return sum
}
