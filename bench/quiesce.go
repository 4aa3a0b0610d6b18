package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// quiesce readies Postgres for a latency row: it drops the schemas the
// earlier rows left (bench_*, keep excepted; every row makes its own
// afresh) and waits, at most two minutes, until no autovacuum worker
// runs. In a full run the drain, fairness and tracing rows leave millions
// of rows behind, and autovacuum working through them took 45 % of a
// core during the e2e row that followed.
func (e *env) quiesce(ctx context.Context, keep string) error {
	rows, err := e.pool.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench\_%' AND nspname <> $1`, keep)
	if err != nil {
		return err
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, s := range schemas {
		if _, err := e.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", s, err)
		}
	}
	began := time.Now()
	err = e.waitFor(ctx, 2*time.Minute, "autovacuum", func() (bool, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&n)
		return n == 0, err
	})
	if err != nil {
		return err
	}
	if len(schemas) > 0 {
		fmt.Printf("bench: dropped the earlier rows' schemas (%s); autovacuum idle after %s\n", strings.Join(schemas, ", "), time.Since(began).Round(time.Millisecond))
	}
	return nil
}
