package store_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

var (
	appendPathsRounds = flag.Int("append-paths-rounds", 5,
		"BenchmarkAppendPaths: rounds (each runs every path once, in a new random order)")
	appendPathsN = flag.Int("append-paths-n", 500,
		"BenchmarkAppendPaths: appends per path per round (one per stream)")
	appendPathsOnly = flag.String("append-paths-only", "",
		"BenchmarkAppendPaths: comma-separated path names to run besides plain (empty: all)")
)

// appendPathsChunk is how many appends of one path run before the next
// path's.
const appendPathsChunk = 20

// appendPath is one way an append can go: the table it inserts into, the
// trigger that table has, the state its streams are in before each round,
// and what the bridge must do afterwards for it (fold, measured apart).
type appendPath struct {
	name string
	// setup creates the path's table and trigger: {schema}, {table}.
	setup string
	// own: the path appends to the bridge's own events table (migrated
	// trigger), not to a copy of it.
	own bool
	// caughtUp: every stream the round appends to is caught up (its
	// watermark at its last version) before the round, so each append
	// makes a caught-up stream pending; otherwise they are all pending.
	caughtUp bool
	// idle: a drainer waits (holds the idle lock exclusively and
	// listens) during the round, so appends that make a stream pending
	// notify.
	idle bool
	// migration, when set, is a migration file whose trigger function is
	// put on a copy of the events table (a statement trigger, as the
	// migrations have it).
	migration string
	// foldOwn: the store's fold runs after the round (own table).
	foldOwn bool
	// fold, when set, is what the bridge runs after the round to take
	// the appends' markers into the streams table ({schema}, {table}):
	// run until it returns no row, its backend's CPU reported per append.
	fold string
}

// appendPathsCopy is a table of the events table's layout (columns,
// indexes, identity), without its trigger.
const appendPathsCopy = `CREATE TABLE {schema}.{table} (LIKE {schema}.events INCLUDING ALL);`

// appendPathsMarker is a table with no index the marker triggers insert
// into: one row per event appended, consumed by a fold.
const appendPathsMarker = `CREATE TABLE {schema}.{table}_appended (stream text NOT NULL, version bigint NOT NULL, created timestamptz NOT NULL);`

// appendPathsFold takes up to 64 markers, oldest rows first in heap
// order, and upserts their streams as the trigger of migration 004 did
// (the head, and pending_since when the stream was caught up).
const appendPathsFold = `WITH m AS (
    DELETE FROM {schema}.{table}_appended a
    WHERE a.ctid = ANY (ARRAY(SELECT ctid FROM {schema}.{table}_appended LIMIT 64 FOR UPDATE SKIP LOCKED))
    RETURNING a.stream, a.version, a.created
), n AS (
    SELECT stream, max(version) AS head, LEAST(min(created), now()) AS since FROM m GROUP BY stream
)
INSERT INTO {schema}.streams AS s (stream, head, pending_since)
SELECT stream, head, since FROM n ORDER BY stream
ON CONFLICT (stream) DO UPDATE
    SET head = GREATEST(s.head, EXCLUDED.head),
        pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
        updated_at = now()
RETURNING 1`

// appendPathsList is every path the benchmark measures.
func appendPathsList() []appendPath {
	return []appendPath{
		{name: "plain", setup: appendPathsCopy},
		{name: "stmt-noop", setup: appendPathsCopy + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{table}_f();`},
		{name: "row-noop", setup: appendPathsCopy + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} FOR EACH ROW EXECUTE FUNCTION {schema}.{table}_f();`},
		// Migration 008's trigger on a copy: the stream pending (the lock
		// and read of its row), caught up (the upsert that makes it
		// pending), caught up with a drainer waiting on the idle lock
		// (the upsert, the lock's try and a NOTIFY).
		{name: "008-pending", migration: "008_pending_append.sql"},
		{name: "008-caught-up", migration: "008_pending_append.sql", caughtUp: true},
		{name: "008-caught-up-notify", migration: "008_pending_append.sql", caughtUp: true, idle: true},
		// The bridge's own events table as migrated (009): no drainer
		// waits (the marker; the store's fold after the round), and a
		// drainer waits (008's way, caught up: the upsert and a NOTIFY).
		{name: "own", own: true, caughtUp: true, foldOwn: true},
		{name: "own-waiting", own: true, caughtUp: true, idle: true},
		// An insert-only marker: a row trigger, a statement trigger with
		// its transition table; with the idle lock's shared try (no
		// drainer waits: no notification, the lock held to the commit).
		{name: "marker-row", caughtUp: true, fold: appendPathsFold, setup: appendPathsCopy + appendPathsMarker + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.{table}_appended VALUES (NEW.stream, NEW.version, NEW.created);
    RETURN NULL;
END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} FOR EACH ROW EXECUTE FUNCTION {schema}.{table}_f();`},
		{name: "marker-stmt", caughtUp: true, fold: appendPathsFold, setup: appendPathsCopy + appendPathsMarker + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.{table}_appended SELECT n.stream, n.version, n.created FROM new_events n;
    RETURN NULL;
END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{table}_f();`},
		{name: "marker-stmt-idle", caughtUp: true, fold: appendPathsFold, setup: appendPathsCopy + appendPathsMarker + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.{table}_appended SELECT n.stream, n.version, n.created FROM new_events n;
    IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{table}_f();`},
		{name: "marker-row-idle", caughtUp: true, fold: appendPathsFold, setup: appendPathsCopy + appendPathsMarker + `
CREATE FUNCTION {schema}.{table}_f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.{table}_appended VALUES (NEW.stream, NEW.version, NEW.created);
    IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} FOR EACH ROW EXECUTE FUNCTION {schema}.{table}_f();`},
	}
}

// BenchmarkAppendPaths decomposes what an append costs Postgres, path by
// path, as the CPU of the appending backend (/proc/<pid>/schedstat) per
// append: one connection appends one event of 512 B per transaction
// (store.Append) to each of -append-paths-n streams (default 500) of
// each path, in -append-paths-rounds rounds (default 5), the paths in a
// new random order each round, so that other work on the machine falls
// on all of them alike. The paths:
//
//   - plain: a copy of the events table without a trigger (the bare
//     insert);
//   - stmt-noop, row-noop: the copy with a statement trigger with a
//     transition table, or a row trigger, whose body does nothing;
//   - 008-pending, 008-caught-up, 008-caught-up-notify: migration 008's
//     trigger on a copy, every stream pending (the lock and read of its
//     streams row), caught up (the upsert that makes it pending), caught
//     up with a drainer waiting on the idle lock (the upsert, the lock's
//     try and a NOTIFY);
//   - marker-row, marker-stmt, marker-stmt-idle, marker-row-idle:
//     sketches of an insert-only pending marker (a row of an unindexed
//     table) written by a row or a statement trigger, with or without
//     the idle lock's shared try; each followed by a fold that takes the
//     markers into the streams table (the upsert, 64 markers a
//     statement), its CPU reported apart;
//   - own, own-waiting: the bridge's own events table as migrated
//     (migration 009), streams caught up: no drainer waits (the marker,
//     then the store's fold, reported apart), and a drainer waits (008's
//     way: the upsert and a NOTIFY).
//
// Metrics per path: <path>-µs (median over rounds of the appender's CPU
// per append), <path>-x (median over rounds of the ratio to plain's in
// the same round), and for the marker paths <path>-fold-µs (the fold's
// CPU per append). Postgres must run on this machine. Run it with fsync
// on, as production does (ALTER SYSTEM SET fsync = on, then a reload):
//
//	go test ./store/ -run '^$' -bench AppendPaths -benchtime 1x -append-paths-rounds 7
func BenchmarkAppendPaths(b *testing.B) {
	ctx := b.Context()
	admin := jsbridgetest.Pool(b)
	schema := jsbridgetest.Schema(b, admin)
	s, err := store.New(admin, store.WithSchema(schema))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	var fsync string
	if err := admin.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		b.Fatal(err)
	}
	b.Logf("fsync %s", fsync)
	only := map[string]bool{}
	for _, n := range strings.Split(*appendPathsOnly, ",") {
		if n != "" {
			only[n] = true
		}
	}
	var paths []appendPath
	for _, p := range appendPathsList() {
		if len(only) == 0 || only[p.name] || p.name == "plain" {
			paths = append(paths, p)
		}
	}

	appender, pids := appendCostPool(b, "appendpaths", 1)
	folder, folderPIDs := appendCostPool(b, "appendpaths-fold", 1)
	folderStore, err := store.New(folder, store.WithSchema(schema))
	if err != nil {
		b.Fatal(err)
	}
	n := *appendPathsN
	data := []byte(`{"pad":"` + strings.Repeat("x", 502) + `"}`)
	stores := make([]*store.Store, len(paths))
	for i, p := range paths {
		table := schema + ".events"
		opts := []store.Option{store.WithSchema(schema)}
		if p.migration != "" {
			raw, err := os.ReadFile("migrations/" + p.migration)
			if err != nil {
				b.Fatal(err)
			}
			p.setup = appendPathsCopy + strings.ReplaceAll(string(raw), "{schema}.jsbridge_events_inserted()", "{schema}.{table}_f()") + `;
CREATE TRIGGER t AFTER INSERT ON {schema}.{table} REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{table}_f();`
		}
		if !p.own {
			tname := appendPathsTable(p)
			table = schema + "." + tname
			r := strings.NewReplacer("{schema}", schema, "{table}", tname)
			if _, err := admin.Exec(ctx, r.Replace(p.setup)); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			opts = append(opts, store.WithEventsTable(table))
		}
		if stores[i], err = store.New(appender, opts...); err != nil {
			b.Fatal(err)
		}
		// Every stream has its first event (and, on a table with a
		// trigger, its streams row) before the rounds.
		for k := range n {
			if _, err := stores[i].Append(ctx, appendPathsStream(p, k), store.AnyVersion, store.NewEvent{Name: "Happened", Data: data}); err != nil {
				b.Fatal(err)
			}
		}
		if p.fold != "" {
			appendPathsRunFold(b, folder, schema, p)
		}
		if err := store.Fold(ctx, s); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "ANALYZE "+table); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := admin.Exec(ctx, "ANALYZE "+schema+".streams"); err != nil {
		b.Fatal(err)
	}

	idle := appendPathsIdleConn(b, schema)
	cpu := make(map[string][]float64)
	ratio := make(map[string][]float64)
	foldCPU := make(map[string][]float64)
	rng := rand.New(rand.NewPCG(33, 33))
	b.ResetTimer()
	for range *appendPathsRounds {
		// Each stream once a round, the paths interleaved in chunks of
		// appendPathsChunk appends in a new random order each time, so
		// that a burst of other work on the machine falls on all alike.
		for _, p := range paths {
			if p.caughtUp {
				appendPathsCatchUp(b, admin, s, schema, p)
			}
		}
		order := make([][]int, len(paths))
		for i := range paths {
			order[i] = rng.Perm(n)
		}
		used := make([]time.Duration, len(paths))
		for at := 0; at < n; at += appendPathsChunk {
			for _, i := range rng.Perm(len(paths)) {
				p := paths[i]
				if p.idle {
					appendPathsExec(b, idle, "SELECT pg_advisory_lock(hashtextextended('jsbridge idle "+schema+"', 0))")
				}
				c0 := cpuOf(pids)
				for _, k := range order[i][at:min(at+appendPathsChunk, n)] {
					if _, err := stores[i].Append(ctx, appendPathsStream(p, k), store.AnyVersion, store.NewEvent{Name: "Happened", Data: data}); err != nil {
						b.Fatal(err)
					}
				}
				used[i] += cpuOf(pids) - c0
				if p.idle {
					appendPathsExec(b, idle, "SELECT pg_advisory_unlock(hashtextextended('jsbridge idle "+schema+"', 0))")
				}
			}
		}
		for i, p := range paths {
			us := float64(used[i].Nanoseconds()) / 1e3 / float64(n)
			cpu[p.name] = append(cpu[p.name], us)
			ratio[p.name] = append(ratio[p.name], float64(used[i])/float64(used[0]))
			if p.fold != "" || p.foldOwn {
				f0 := cpuOf(folderPIDs)
				if p.foldOwn {
					if err := store.Fold(ctx, folderStore); err != nil {
						b.Fatal(err)
					}
				} else {
					appendPathsRunFold(b, folder, schema, p)
				}
				foldCPU[p.name] = append(foldCPU[p.name], float64((cpuOf(folderPIDs)-f0).Nanoseconds())/1e3/float64(n))
			}
		}
	}
	b.StopTimer()
	for _, p := range paths {
		b.ReportMetric(appendPathsMedian(cpu[p.name]), p.name+"-µs")
		if p.name != "plain" {
			b.ReportMetric(appendPathsMedian(ratio[p.name]), p.name+"-x")
		}
		if p.fold != "" || p.foldOwn {
			b.ReportMetric(appendPathsMedian(foldCPU[p.name]), p.name+"-fold-µs")
		}
		b.Logf("%-18s µs %s  × plain %s  fold µs %s", p.name, appendPathsFormat(cpu[p.name]), appendPathsFormat(ratio[p.name]), appendPathsFormat(foldCPU[p.name]))
	}
}

// appendPathsTable is the name of path p's copy of the events table.
func appendPathsTable(p appendPath) string {
	return "p_" + strings.NewReplacer("-", "_").Replace(p.name)
}

// appendPathsStream is the name of path p's k-th stream.
func appendPathsStream(p appendPath, k int) string { return fmt.Sprintf("%s-%d", p.name, k) }

// appendPathsCatchUp moves the watermark of every stream of path p to its
// last version, as an ack would.
func appendPathsCatchUp(b *testing.B, pool *pgxpool.Pool, s *store.Store, schema string, p appendPath) {
	b.Helper()
	table := schema + ".events"
	if !p.own {
		table = schema + "." + appendPathsTable(p)
	} else if err := store.Fold(b.Context(), s); err != nil {
		b.Fatal(err)
	}
	_, err := pool.Exec(b.Context(), `UPDATE `+schema+`.streams s
SET watermark = t.top, head = t.top, updated_at = now()
FROM (SELECT stream, max(version) AS top FROM `+table+` WHERE stream LIKE $1 || '-%' GROUP BY stream) t
WHERE s.stream = t.stream AND s.watermark <> t.top`, p.name)
	if err != nil {
		b.Fatal(err)
	}
}

// appendPathsRunFold runs path p's fold until no marker is left.
func appendPathsRunFold(b *testing.B, pool *pgxpool.Pool, schema string, p appendPath) {
	b.Helper()
	q := strings.NewReplacer("{schema}", schema, "{table}", appendPathsTable(p)).Replace(p.fold)
	for {
		tag, err := pool.Exec(b.Context(), q)
		if err != nil {
			b.Fatal(err)
		}
		if tag.RowsAffected() == 0 {
			return
		}
	}
}

// appendPathsIdleConn is a connection that listens as a drainer does; it
// holds the idle lock (as a waiting drainer) around the chunks of the
// paths with idle set.
func appendPathsIdleConn(b *testing.B, schema string) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(b.Context(), jsbridgetest.DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	appendPathsExec(b, conn, "LISTEN "+schema)
	return conn
}

func appendPathsExec(b *testing.B, conn *pgx.Conn, q string) {
	b.Helper()
	if _, err := conn.Exec(b.Context(), q); err != nil {
		b.Fatal(err)
	}
}

func appendPathsMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func appendPathsFormat(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}
