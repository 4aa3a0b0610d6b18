package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
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
// moves to the highest version of its markers (in a backlog, below, its
// highest committed version) and a caught-up stream becomes pending
// since its oldest marker's created time. At most $1 markers,
// locked and deleted: two folds never take the same one (SKIP LOCKED).
//
// A fold that reads its limit (a backlog of markers: a bulk insert,
// appends while every bridge was down) writes the stream's highest
// committed version as its head (one probe of the events index), not
// only the highest of the markers it read, and deletes a marker at or
// below its stream's head (it says nothing new: the head only grows)
// without the row being locked or written: each row is then written
// once, and the folds after it only delete markers, where each fold of
// at most $1 markers would otherwise write every row again. A lighter
// fold (the live path: a few markers a stream at most) does neither, so
// it pays no probe.
//
// A stream whose row another transaction holds (a settle, an appender
// while a drainer waits) keeps its markers for a later fold, never waited
// for; with $3, so does a stream under a live lease (leased_until past
// now): its settle would otherwise wait for this fold's transaction (a
// claim, and its fetch, ahead of that settle), and the settle's own fold
// or the next claim's takes them. The rows are locked in stream order. A
// stream without a row gets one here: since migration 010 only a fold
// inserts a streams row (an appender writes markers for a stream without
// one), so the insert waits at most for another fold inserting the same
// stream, never for an appender, which could be waiting for a row this
// fold holds. It returns the markers it read and those it left for these
// reasons.
//
// It also does the catch-up (the catchUp statement) for the streams $2
// (NULL: none), which a settle earlier in the transaction holds: each
// that the settle left caught up with an event past its watermark in
// this statement's snapshot, taken after the settle holds its row, is
// taken as a marker of its first such event would be (pending since that
// event's created time; the head a lower bound, as since migration 008).
// AckClaim runs it so, in place of the catch-up statement: a statement
// fewer a cycle, where a statement's fixed cost (its binding, executor
// start-up and end) is most of a light cycle's.
const foldSQL = `WITH m AS MATERIALIZED (
    SELECT a.ctid AS at, a.stream, a.version, a.created FROM {schema}.appended a
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), full_read AS MATERIALIZED (
    -- a fold that read its limit: a backlog of markers
    SELECT count(*) >= $1 AS yes FROM m
), mm AS MATERIALIZED (
    -- covered (only looked for in a backlog): a marker the head already
    -- reaches, deleted with the row left alone
    SELECT m.at, m.stream, m.version, m.created, coalesce(m.version <= x.head, false) AS covered
    FROM m LEFT JOIN {schema}.streams x ON x.stream = m.stream AND (SELECT yes FROM full_read)
), behind AS MATERIALIZED (
    -- the catch-up's streams: left caught up by the settle, an event past
    -- the watermark; one probe of each index
    SELECT x.stream, e.version, e.created FROM {schema}.streams x
    CROSS JOIN LATERAL (
        SELECT ev.version, ev.created FROM {events} ev
        WHERE ev.stream = x.stream AND ev.version > x.watermark
        ORDER BY ev.version LIMIT 1) e
    WHERE x.stream = ANY ($2::text[]) AND NOT x.pending
), mine AS MATERIALIZED (
    -- index probes of the streams named, never a scan of the table
    SELECT s.stream FROM {schema}.streams s
    WHERE s.stream = ANY (ARRAY(
            SELECT stream FROM mm WHERE NOT covered
            UNION SELECT stream FROM behind))
        AND NOT ($3 AND coalesce(s.leased_until > now(), false))
    ORDER BY s.stream
    FOR NO KEY UPDATE SKIP LOCKED
), take AS MATERIALIZED (
    SELECT mm.at, mm.stream, mm.version, mm.created FROM mm
    WHERE NOT mm.covered
      AND (mm.stream IN (SELECT stream FROM mine) -- a row this fold holds
       -- else (only then: OR stops at the first true) a new stream, with no row yet
       OR NOT EXISTS (SELECT 1 FROM {schema}.streams x WHERE x.stream = mm.stream))
), gone AS (
    DELETE FROM {schema}.appended a
    WHERE a.ctid = ANY (ARRAY(SELECT at FROM take UNION ALL SELECT at FROM mm WHERE covered))
), up AS (
    INSERT INTO {schema}.streams AS s (stream, head, pending_since)
    SELECT t.stream,
        -- in a backlog, the highest committed version: later markers are
        -- then covered (GREATEST ignores the NULL of a light fold)
        GREATEST(max(t.version), CASE WHEN (SELECT yes FROM full_read) THEN
            (SELECT max(ev.version) FROM {events} ev WHERE ev.stream = t.stream) END),
        LEAST(min(t.created), now())
    FROM (
        SELECT stream, version, created FROM take
        UNION ALL
        SELECT stream, version, created FROM behind WHERE stream IN (SELECT stream FROM mine)
    ) t
    GROUP BY t.stream
    ORDER BY t.stream -- a fixed lock order across concurrent folds
    ON CONFLICT (stream) DO UPDATE
        SET head = GREATEST(s.head, EXCLUDED.head),
            pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
            updated_at = now()
        WHERE EXCLUDED.head > s.head -- else nothing changes
    RETURNING 1
)
SELECT (SELECT count(*) FROM m),
    (SELECT count(*) FROM mm WHERE NOT covered) - (SELECT count(*) FROM take)`

// foldQuery is foldSQL for schema and its events table.
func foldQuery(schema, events string) string {
	return strings.NewReplacer("{schema}", schema, "{events}", events).Replace(foldSQL)
}

// queueFold queues the fold (foldSQL) in b, ahead of a claim in the same
// transaction: the claim then sees every marker committed before it. With
// settled (the streams a settle earlier in b holds), the fold also does
// their catch-up, in place of the catchUp statement (queueCatchUp). It
// sets *left when the fold left markers (more than foldLimit, or rows
// other transactions held), so that the caller has the drain look again
// soon. An external events table has no markers and no catch-up: nothing
// is queued.
func (s *Store) queueFold(b *pgx.Batch, settled []string, left *bool) {
	if s.External() {
		return
	}
	b.Queue(s.q.fold, foldLimit, settled, true).QueryRow(func(r pgx.Row) error {
		var read, kept int64
		if err := r.Scan(&read, &kept); err != nil {
			return err
		}
		*left = *left || kept > 0 || read == foldLimit
		s.folded(read-kept, read == foldLimit)
		return nil
	})
}

// fold runs the fold until no marker is left that it can take, for
// readers of the streams table that must count every committed event
// (Streams, Backlog, Totals, Unblock, Reset). Markers whose rows other
// transactions hold are left to the next claim's fold. The markers these
// folds take do not count towards the marker table's vacuum: the claims'
// folds take nearly all of them, and a store that only reads (the
// bridge's metrics, an operator's command about to exit) then never
// starts one.
func (s *Store) fold(ctx context.Context) error {
	if s.External() {
		return nil
	}
	for {
		var read, kept int64
		if err := s.pool.QueryRow(ctx, s.q.fold, foldLimit, nil, false).Scan(&read, &kept); err != nil {
			return fmt.Errorf("fold appended markers: %w", err)
		}
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
// markerVacuumEvery markers the claims folded keeps the heap at a few
// seconds of appends. It runs in the background, one at a time, until
// the Store is closed (Close).
type markerVacuum struct {
	every int64
	sql   string             // the vacuum statement
	since atomic.Int64       // markers folded since the last vacuum began
	mu    sync.Mutex         // guards what follows
	done  chan struct{}      // closed when the running vacuum ends; nil when none runs
	stop  context.CancelFunc // cancels the running vacuum
	shut  bool               // Close was called: no more vacuums
}

// folded counts n markers taken by a claim's fold and, past
// markers.every since the last one, starts a vacuum of the marker table
// in the background, unless one is running or the Store is closed. While
// the folds read full (full: a backlog of markers, from a bulk insert or
// appends while no bridge ran) it waits for the first fold that is not:
// a vacuum then walks a heap of the whole backlog, over and over while
// the drain takes it, where the folds that delete from its front walk
// only what they left behind them (pruned as they pass).
func (s *Store) folded(n int64, full bool) {
	if n <= 0 || s.markers.since.Add(n) < s.markers.every || full {
		return
	}
	m := &s.markers
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shut || m.done != nil {
		return
	}
	m.since.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), markerVacuumTimeout)
	done := make(chan struct{})
	m.done, m.stop = done, cancel
	go func() {
		defer close(done)
		defer cancel()
		// SKIP_LOCKED: another bridge's vacuum, or autovacuum's, is as
		// good. TRUNCATE false: giving back the heap's empty tail takes an
		// exclusive lock that appends would queue behind; the space is
		// reused instead, and autovacuum still truncates. A role that does
		// not own the table gets a warning, not an error, and leaves it to
		// autovacuum.
		_, err := s.pool.Exec(ctx, m.sql, pgx.QueryExecModeSimpleProtocol)
		m.mu.Lock()
		m.done, m.stop = nil, nil
		closing := m.shut
		m.mu.Unlock()
		if err != nil && !closing {
			s.log.Warn("vacuum the marker table", "schema", s.schema, "err", err)
		}
	}()
}

// Close stops the Store's background work: a vacuum of the marker table
// that is running (store/fold.go) is cancelled and waited for, and none
// is started after. It does not close the pool, which is the caller's:
// call Close after the last claim (the drain has stopped) and before
// closing the pool, so that no statement of the Store's own is left to
// run on it. Every other method keeps working after Close. Close is safe
// to call more than once and from several goroutines.
func (s *Store) Close() {
	m := &s.markers
	m.mu.Lock()
	m.shut = true
	done, stop := m.done, m.stop
	m.mu.Unlock()
	if done == nil {
		return
	}
	stop()
	<-done
}
