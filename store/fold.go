package store

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// foldLimit is how many markers one fold takes at most: a claim after a
// long stop of every bridge folds this many and has the drain look again
// soon (the claim's skipped row) rather than read them all in one
// statement.
const foldLimit = 10000

// foldSQL takes the markers appends wrote while no drainer waited
// (migration 009: one row of {schema}.appended per event) into the
// streams table, as an append did itself before: per stream, the head
// moves to its highest version and a caught-up stream becomes pending
// since its oldest marker's created time. At most $1 markers, locked and
// deleted: two folds never take the same one (SKIP LOCKED). A stream
// whose row another transaction holds (a settle, an appender while a
// drainer waits) keeps its markers for a later fold, never waited for;
// the rows are locked in stream order. It returns the markers it read and
// those it left for that reason.
const foldSQL = `WITH m AS MATERIALIZED (
    SELECT a.ctid AS at, a.stream, a.version, a.created FROM {schema}.appended a
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), mine AS MATERIALIZED (
    -- index probes of the streams named, never a scan of the table
    SELECT s.stream FROM {schema}.streams s
    WHERE s.stream = ANY (ARRAY(SELECT DISTINCT stream FROM m))
    ORDER BY s.stream
    FOR NO KEY UPDATE SKIP LOCKED
), take AS MATERIALIZED (
    SELECT m.at, m.stream, m.version, m.created FROM m
    WHERE m.stream IN (SELECT stream FROM mine) -- a row this fold holds
       -- else (only then: OR stops at the first true) a new stream, with no row yet
       OR NOT EXISTS (SELECT 1 FROM {schema}.streams x WHERE x.stream = m.stream)
), gone AS (
    DELETE FROM {schema}.appended a WHERE a.ctid = ANY (ARRAY(SELECT at FROM take))
), up AS (
    INSERT INTO {schema}.streams AS s (stream, head, pending_since)
    SELECT stream, max(version), LEAST(min(created), now()) FROM take
    GROUP BY stream
    ORDER BY stream -- a fixed lock order across concurrent folds
    ON CONFLICT (stream) DO UPDATE
        SET head = GREATEST(s.head, EXCLUDED.head),
            pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
            updated_at = now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM m) - (SELECT count(*) FROM take)`

// foldQuery is foldSQL for schema.
func foldQuery(schema string) string { return strings.ReplaceAll(foldSQL, "{schema}", schema) }

// queueFold queues the fold (foldSQL) in b, ahead of a claim in the same
// transaction: the claim then sees every marker committed before it. It
// sets *left when the fold left markers (more than foldLimit, or rows
// other transactions held), so that the caller has the drain look again
// soon. An external events table has no markers: nothing is queued.
func (s *Store) queueFold(b *pgx.Batch, left *bool) {
	if s.External() {
		return
	}
	b.Queue(s.q.fold, foldLimit).QueryRow(func(r pgx.Row) error {
		var read, kept int64
		if err := r.Scan(&read, &kept); err != nil {
			return err
		}
		*left = *left || kept > 0 || read == foldLimit
		s.folded(read - kept)
		return nil
	})
}

// fold runs the fold until no marker is left that it can take, for
// readers of the streams table that must count every committed event
// (Streams, Backlog, Totals, Unblock, Reset). Markers whose rows other
// transactions hold are left to the next claim's fold.
func (s *Store) fold(ctx context.Context) error {
	if s.External() {
		return nil
	}
	for {
		var read, kept int64
		if err := s.pool.QueryRow(ctx, s.q.fold, foldLimit).Scan(&read, &kept); err != nil {
			return fmt.Errorf("fold appended markers: %w", err)
		}
		s.folded(read - kept)
		if read < foldLimit || kept == read {
			return nil
		}
	}
}

// markerVacuumEvery is how many markers a Store folds between two
// vacuums of the marker table (markerVacuum): about 2 s of appends at
// 1,000 a second.
const markerVacuumEvery = 2000

// markerVacuumTimeout bounds one vacuum of the marker table.
const markerVacuumTimeout = time.Minute

// markerVacuum is the Store's own vacuum of {schema}.appended. The table
// is a queue: every marker is inserted once and deleted by a fold, and
// each fold reads the whole heap (it has no index to start from), dead
// rows and the pages they leave included. Autovacuum visits a database
// at most once per autovacuum_naptime (1 min by default) whatever the
// table's own thresholds, so between its visits the heap grows by a
// minute of appends and every fold walks it. A vacuum after every
// markerVacuumEvery folded markers keeps the heap at a few seconds of
// appends.
type markerVacuum struct {
	every   int64
	since   atomic.Int64 // markers folded since the last vacuum began
	running atomic.Bool
}

// folded counts n markers taken by a fold and, past markers.every since
// the last one, starts a vacuum of the marker table in the background,
// unless one is running.
func (s *Store) folded(n int64) {
	if n <= 0 || s.markers.since.Add(n) < s.markers.every || !s.markers.running.CompareAndSwap(false, true) {
		return
	}
	s.markers.since.Store(0)
	go func() {
		defer s.markers.running.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), markerVacuumTimeout)
		defer cancel()
		// SKIP_LOCKED: another bridge's vacuum, or autovacuum's, is as
		// good. TRUNCATE false: giving back the heap's empty tail takes an
		// exclusive lock that appends would queue behind; the space is
		// reused instead, and autovacuum still truncates. A role that does
		// not own the table gets a warning, not an error, and leaves it to
		// autovacuum.
		_, err := s.pool.Exec(ctx, "VACUUM (SKIP_LOCKED, TRUNCATE false) "+s.schema+".appended", pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			s.log.Warn("vacuum the marker table", "schema", s.schema, "err", err)
		}
	}()
}
