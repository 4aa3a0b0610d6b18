package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The live pipeline rows' commits and statements, told apart (issue 33's
// "commits per event" target): pg_stat_database.xact_commit counts every
// transaction that ended in a commit, read-only ones included (a SELECT
// in autocommit, an advisory lock, a claim that found nothing), which
// cost Postgres no WAL flush; the target is on the transactions that
// write. A transaction that writes is given a transaction id, and
// pg_snapshot_xmax(pg_current_snapshot()), the next id to be given (it
// gives none itself), moves by one for each: its move during the run,
// less the appends' own, is the pipeline's write transactions. It counts
// the whole server's (every database's, autovacuum's analyzes): run the
// row on a server nothing else writes to, as the bench's own is.

// liveXacts are the database's transaction counters at one moment.
type liveXacts struct {
	// commits is pg_stat_database.xact_commit: every commit, read-only
	// transactions included.
	commits int64
	// xmax is the next transaction id Postgres will give: ids given so
	// far, one per transaction that wrote (committed or rolled back).
	xmax int64
	// walSyncs is pg_stat_wal.wal_sync: the server's WAL flushes to disk
	// (commits that waited for one, and the WAL writer's), appends'
	// included; -1 where the view is missing (before Postgres 14).
	walSyncs int64
}

// liveXactCounters reads liveXacts. xact_commit is the statistics
// collector's (settleCounts waits for it); xmax is exact at once.
func (e *env) liveXactCounters(ctx context.Context) (liveXacts, error) {
	var x liveXacts
	err := e.pool.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&x.commits, &x.xmax)
	if err != nil {
		return x, err
	}
	if e.pool.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&x.walSyncs) != nil {
		x.walSyncs = -1
	}
	return x, nil
}

// liveCommitSplit is a run's transactions beyond the appends' own, per
// event appended: those that wrote (given a transaction id) and the
// read-only rest of xact_commit.
type liveCommitSplit struct {
	all, write, readOnly float64
	// walSyncs is the server's WAL flushes per event, the appends'
	// included (group commit shares one among the commits waiting);
	// -1 when unknown.
	walSyncs float64
}

// splitCommits computes liveCommitSplit from the counters before and
// after a run of events appends, one transaction each. A transaction that
// wrote and rolled back counts as a write (it was given an id) and not in
// xact_commit, so readOnly can be a little low; never below 0.
func splitCommits(before, after liveXacts, events int) liveCommitSplit {
	n := float64(max(events, 1))
	commits := after.commits - before.commits
	writes := after.xmax - before.xmax
	syncs := -1.0
	if before.walSyncs >= 0 && after.walSyncs >= 0 {
		syncs = float64(after.walSyncs-before.walSyncs) / n
	}
	return liveCommitSplit{
		all:      float64(commits-int64(events)) / n,
		write:    float64(writes-int64(events)) / n,
		readOnly: float64(max(commits-writes, 0)) / n,
		walSyncs: syncs,
	}
}

// line prints s.
func (s liveCommitSplit) line() string {
	out := fmt.Sprintf("write commits %.3f/event beyond the append's own (transaction ids given), read-only %.3f/event; xact_commit %.3f/event", s.write, s.readOnly, s.all)
	if s.walSyncs >= 0 {
		out += fmt.Sprintf("; WAL flushes %.3f/event (the server's, appends' included)", s.walSyncs)
	}
	return out
}

// The kinds of statement the live pipeline rows count apart, in the
// order they print, each recognised by a piece of its text
// (statementKind). The appends are the generator's; "bare" is the bare
// bridge's read and position update.
var liveStatementKinds = []string{"appends", "fold", "claim+fetch", "claim", "fetch", "ack", "catch-up", "lock_timeout", "idle/busy", "wake", "release", "bare", "other"}

// statementKind names the kind of a pg_stat_statements query text.
func statementKind(query string) string {
	has := func(s string) bool { return strings.Contains(query, s) }
	switch {
	case has("INSERT INTO") && has("(stream, version, name, data, meta)"):
		return "appends"
	case has("WITH m AS MATERIALIZED") && has(".appended a"):
		return "fold"
	case has("WITH due AS MATERIALIZED") && has("LEFT JOIN LATERAL"):
		return "claim+fetch"
	case has("WITH due AS MATERIALIZED"):
		return "claim"
	case has("AS c(stream, watermark, ord)"):
		return "fetch"
	case has("SET watermark = GREATEST") && has("retry = $"):
		return "ack"
	case has("SET head = t.top"):
		return "catch-up"
	case has("set_config("):
		return "lock_timeout"
	case has("advisory"):
		return "idle/busy"
	case has("pg_notify"):
		return "wake"
	case has("SET leased_by = NULL, leased_until = NULL") && has("RETURNING stream"):
		return "release"
	case has("bare_position") || has("WHERE id > $1"):
		return "bare"
	default:
		return "other"
	}
}

// liveStatement is one kind's calls and execution time.
type liveStatement struct {
	calls int64
	time  time.Duration
}

// liveStatementsNow is pg_stat_statements of the database by queryid:
// the query's kind, its calls and its total execution time.
func (e *env) liveStatementsNow(ctx context.Context) (map[int64]liveStatementEntry, error) {
	rows, err := e.pool.Query(ctx, `SELECT queryid, query, calls, total_exec_time FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]liveStatementEntry{}
	for rows.Next() {
		var id, calls int64
		var query string
		var ms float64
		if err := rows.Scan(&id, &query, &calls, &ms); err != nil {
			return nil, err
		}
		out[id] = liveStatementEntry{kind: statementKind(query), liveStatement: liveStatement{calls: calls, time: time.Duration(ms * float64(time.Millisecond))}}
	}
	return out, rows.Err()
}

// liveStatementEntry is one pg_stat_statements entry, its kind named.
type liveStatementEntry struct {
	kind string
	liveStatement
}

// statementsByKind sums, by kind, what each entry of after did beyond
// before (an entry new in after counts whole).
func statementsByKind(before, after map[int64]liveStatementEntry) map[string]liveStatement {
	out := map[string]liveStatement{}
	for id, a := range after {
		b := before[id]
		k := out[a.kind]
		k.calls += a.calls - b.calls
		k.time += a.time - b.time
		out[a.kind] = k
	}
	return out
}

// statementsLine prints, by kind, calls and execution time per event
// appended; "none" when pg_stat_statements was not read.
func statementsLine(kinds map[string]liveStatement, events int) string {
	if kinds == nil {
		return "none"
	}
	n := float64(max(events, 1))
	var parts []string
	for _, k := range liveStatementKinds {
		s, ok := kinds[k]
		if !ok || s.calls == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.3f calls, %.1f µs", k, float64(s.calls)/n, float64(s.time.Nanoseconds())/1e3/n))
	}
	return "per event: " + strings.Join(parts, "; ")
}

// commitsLine prints the run's commits per event, told apart where the
// counters were read, and its statements by kind.
func (f livePipeFigures) commitsLine() string {
	s := fmt.Sprintf("commits %.3f/event beyond the append's own", f.commitsPerEvent())
	if f.splitKnown {
		s = f.split.line()
	}
	if f.statements != nil {
		s += "; statements " + statementsLine(f.statements, f.events)
	}
	return s
}

// writeCommitsPerEvent is the target's figure: write commits per event
// beyond the appends' own, or xact_commit's where the split is unknown.
func (f livePipeFigures) writeCommitsPerEvent() float64 {
	if f.splitKnown {
		return f.split.write
	}
	return f.commitsPerEvent()
}

// analyzeLive gathers the planner's statistics of schema's tables after
// the warm-up, as autovacuum has them on a database that has run a
// while: a fresh schema has none, and the planner, taking the 10,000
// streams for a few hundred, reads the whole streams table in the
// drain's statements (the catch-up, the claim's look for a skipped
// stream) instead of probing its indexes.
func (e *env) analyzeLive(ctx context.Context, schema string) error {
	if _, err := e.pool.Exec(ctx, "ANALYZE "+schema+".streams, "+schema+".events"); err != nil {
		return fmt.Errorf("analyze %s: %w", schema, err)
	}
	return nil
}
