package store

import "strings"

// queries holds every statement the store runs, with the schema injected
// once at construction (the schema is a validated plain identifier).
type queries struct {
	createSchema     string
	createMigrations string
	migrationLock    string
	migrationsExist  string
	appliedVersions  string
	recordMigration  string

	tryLock string

	eventsTableExists    string
	eventsTableColumns   string
	eventsIDSequence     string
	ownTables            string
	recordedEventsTables string

	discoveryInit       string
	discoveryState      string
	discoverySettled    string
	discoveryTop        string
	discoveryScan       string
	discoveryAddPending string
	discoveryTrim       string
	discoverySave       string

	head         string
	insertEvents string
	appendOne    string

	fold       string
	claim      string
	claimFetch string
	fetch      string
	ack        string
	ackMany    string
	retry      string
	block      string
	release    string
	catchUp    string
	wake       string

	idleTake  string
	idleWait  string
	idleLetGo string

	postpone  string
	endLeases string

	streams      string
	unblock      string
	unblockMatch string
	reset        string
	backlog      string
	totals       string

	streamEvents string
}

// settleHead is the settling statements' new head and pending_since
// (stream s, new watermark GREATEST(watermark, $3)), read from the first
// event past the new watermark (one probe of the events table's index):
// when there is one, the head is at least its version, so the stream
// stays pending, and pending_since is its created time; else the head is
// at least the new watermark and pending_since is unchanged (caught up:
// the next append sets it). Since migration 008 the head column of a
// pending stream is a lower bound (appends to it do not write the row),
// so the head column alone cannot say whether events are left. When the
// head column is past the new watermark but the statement cannot see the
// event (an append that committed while the settle waited for its row),
// pending_since is now(). {settle_head} in a statement.
const settleHead = `(head, pending_since) = (
        SELECT GREATEST(s.head, $3, max(o.version)),
            CASE WHEN count(*) > 0 THEN min(o.since)
                WHEN s.head > GREATEST(s.watermark, $3) THEN now()
                ELSE s.pending_since END
        FROM (SELECT e.version, LEAST(e.created, now()) AS since FROM {events} e
            WHERE e.stream = s.stream AND e.version > GREATEST(s.watermark, $3)
            ORDER BY e.version LIMIT 1) o)`

// realHead is the last version of stream s (a row of the streams table).
// Since migration 008 the head column of a pending stream is a lower
// bound (an append to a pending stream does not write it), so the last
// version is read from the events table (one probe of its (stream,
// version) index); a caught-up stream's is its watermark or its head,
// whichever is higher (a settle sets both). {real_head} in a statement.
const realHead = `(CASE WHEN s.pending THEN coalesce((
        SELECT max(e.version) FROM {events} e WHERE e.stream = s.stream), s.head)
        ELSE GREATEST(s.head, s.watermark) END)`

func newQueries(schema, events string) queries {
	r := strings.NewReplacer("{schema}", schema, "{events}", events,
		"{settle_head}", strings.ReplaceAll(settleHead, "{events}", events),
		"{real_head}", strings.ReplaceAll(realHead, "{events}", events))
	return queries{
		createSchema: r.Replace(`CREATE SCHEMA IF NOT EXISTS {schema}`),
		createMigrations: r.Replace(`CREATE TABLE IF NOT EXISTS {schema}.jsbridge_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`),
		// Transaction-scoped: released at commit or rollback, even when the
		// connection dies.
		migrationLock:   `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		migrationsExist: r.Replace(`SELECT to_regclass('{schema}.jsbridge_migrations') IS NOT NULL`),
		appliedVersions: r.Replace(`SELECT version FROM {schema}.jsbridge_migrations`),
		// A literal version (fmt verb), so --dry-run prints what runs.
		recordMigration: r.Replace(`INSERT INTO {schema}.jsbridge_migrations (version) VALUES (%d)`),

		tryLock: `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`,

		// $1 is the external events table, quoted as the queries name it.
		eventsTableExists: `SELECT to_regclass($1) IS NOT NULL`,
		// A domain's base type counts; category S is the string types.
		eventsTableColumns: `SELECT a.attname::text, coalesce(b.typname, t.typname)::text,
    coalesce(b.typcategory, t.typcategory)::text, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`,
		// The sequence the id column draws from: an identity's or a
		// serial's (owned by the column), else the one its DEFAULT calls
		// nextval on (the default depends on it); none when the writer
		// gives the ids itself. Its cache size from pg_sequence.
		eventsIDSequence: `SELECT seq::regclass::text, s.seqcache
FROM (SELECT coalesce(to_regclass(pg_get_serial_sequence($1, 'id')),
    (SELECT d.refobjid FROM pg_attrdef ad
     JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum AND a.attname = 'id'
     JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid AND d.refclassid = 'pg_class'::regclass
     JOIN pg_class c ON c.oid = d.refobjid AND c.relkind = 'S'
     WHERE ad.adrelid = to_regclass($1) LIMIT 1)) AS seq) q
JOIN pg_sequence s ON s.seqrelid = q.seq`,
		ownTables:            r.Replace(`SELECT to_regclass('{schema}.events') IS NOT NULL, to_regclass('{schema}.discovery') IS NOT NULL`),
		recordedEventsTables: r.Replace(`SELECT events_table FROM {schema}.discovery ORDER BY events_table`),

		discoveryInit:  r.Replace(`INSERT INTO {schema}.discovery (events_table) VALUES ($1) ON CONFLICT DO NOTHING`),
		discoveryState: r.Replace(`SELECT low, seen FROM {schema}.discovery WHERE events_table = $1`),
		// A pending scan is settled when none of its writers (virtual
		// transaction ids) holds any lock any more: they have all ended.
		discoverySettled: r.Replace(`WITH settled AS (
    DELETE FROM {schema}.discovery_pending p
    WHERE p.events_table = $1
      AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.virtualtransaction = ANY(p.writers))
    RETURNING p.hi
)
SELECT coalesce(array_agg(hi), '{}'), coalesce(max(hi), -1) FROM settled`),
		discoveryTop: r.Replace(`SELECT coalesce(max(id), 0) FROM {events}`),
		// Streams whose head is already at least what was found are left
		// alone (no row lock), so re-reading is cheap. A stream that goes
		// from caught up to pending gets pending_since from its oldest
		// event past the watermark (as the own table's trigger does); a new
		// stream from the oldest event found.
		discoveryScan: r.Replace(`WITH found AS (
    SELECT stream, max(version) AS head, count(*) AS n, LEAST(min(created), now()) AS oldest
    FROM {events} WHERE id > $1 AND id <= $2
    GROUP BY stream
), moved AS (
    INSERT INTO {schema}.streams AS s (stream, head, pending_since)
    SELECT f.stream, f.head, coalesce(f.oldest, now()) FROM found f
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.streams x WHERE x.stream = f.stream AND x.head >= f.head)
    ORDER BY f.stream
    ON CONFLICT (stream) DO UPDATE SET head = GREATEST(s.head, EXCLUDED.head),
        pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE coalesce((
            SELECT LEAST(e.created, now()) FROM {events} e
            WHERE e.stream = s.stream AND e.version > s.watermark
            ORDER BY e.version LIMIT 1), EXCLUDED.pending_since) END,
        updated_at = now()
    RETURNING 1
)
SELECT coalesce((SELECT sum(n) FROM found), 0)::bigint, (SELECT count(*) FROM moved)`),
		// Writers: transactions other than ours holding more than a read
		// lock on the events table or the sequence its ids come from. When
		// the events table is a view, its writers lock the tables the view
		// reads (found through its rewrite rule, views of views too) and
		// the sequences those tables own, not the view: they are watched.
		discoveryAddPending: r.Replace(`WITH RECURSIVE rels(oid) AS (
    SELECT to_regclass($3)::oid
  UNION
    SELECT d.refobjid FROM rels
    JOIN pg_rewrite w ON w.ev_class = rels.oid
    JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
        AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> rels.oid
), watched(oid) AS (
    SELECT oid FROM rels
  UNION
    SELECT to_regclass(pg_get_serial_sequence($3, 'id'))::oid
  UNION
    SELECT d.objid FROM pg_depend d JOIN pg_class c ON c.oid = d.objid AND c.relkind = 'S'
    WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.deptype IN ('a', 'i') AND d.refobjid IN (SELECT oid FROM rels WHERE oid <> to_regclass($3)::oid)
)
INSERT INTO {schema}.discovery_pending (events_table, hi, writers)
SELECT $1, $2, coalesce(array_agg(DISTINCT l.virtualtransaction), '{}')
FROM pg_locks l
WHERE l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation IN (SELECT oid FROM watched WHERE oid IS NOT NULL)
  AND l.mode <> 'AccessShareLock'
  AND l.pid IS DISTINCT FROM pg_backend_pid()
ON CONFLICT (events_table, hi) DO NOTHING`),
		discoveryTrim: r.Replace(`DELETE FROM {schema}.discovery_pending
WHERE events_table = $1
  AND (hi <= $2 OR hi < ANY (SELECT hi FROM {schema}.discovery_pending WHERE events_table = $1 ORDER BY hi DESC OFFSET $3 - 1 LIMIT 1))`),
		discoverySave: r.Replace(`UPDATE {schema}.discovery SET low = $2, seen = $3, updated_at = now() WHERE events_table = $1`),

		head:      r.Replace(`SELECT coalesce(max(version), -1) FROM {events} WHERE stream = $1`),
		appendOne: r.Replace(appendOneSQL),
		// ORDER BY ord makes identity ids follow versions within the append.
		insertEvents: r.Replace(`INSERT INTO {events} (stream, version, name, data, meta)
SELECT $1, $2 + t.ord, t.name, t.data::jsonb, t.meta::jsonb
FROM unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS t(name, data, meta, ord)
ORDER BY t.ord
RETURNING id, version, name, data, meta, created`),

		fold: foldQuery(schema, events),

		// The locking select is materialized so it runs exactly once; SKIP
		// LOCKED means competing claimers never wait for each other. Streams
		// are taken in the order they became due (streams_claimable_idx): when
		// their oldest unforwarded event was appended, or for one in backoff
		// when its backoff ended. The scan stops at the first stream not yet
		// due, so streams in backoff cost nothing.
		//
		// A claim that takes fewer than $2 streams also says, in one more
		// row with skipped set, whether it passed over a due stream whose
		// row another transaction held locked: an appender that has not
		// committed yet. That appender may not notify (the stream was
		// already pending), so Claim has the drain look again soon (see
		// Store.Notifications). The check reads the statement's snapshot
		// and stops at the first such stream.
		claim: r.Replace(`WITH due AS MATERIALIZED (
    SELECT stream, leased_by AS prev_holder FROM {schema}.streams
    WHERE pending AND NOT blocked
      AND coalesce(next_attempt, pending_since) <= now()
      AND (leased_until IS NULL OR leased_until <= now())
    ORDER BY coalesce(next_attempt, pending_since)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.streams s
    SET leased_by = $1, leased_until = now() + $3::bigint * interval '1 microsecond', updated_at = now()
    FROM due WHERE s.stream = due.stream
    RETURNING s.stream, s.watermark, s.retry, s.leased_until, coalesce(due.prev_holder, '') AS prev_holder
)
SELECT stream, watermark, retry, leased_until, prev_holder, false AS skipped FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, true
WHERE (SELECT count(*) FROM due) < $2 AND EXISTS (
    SELECT 1 FROM {schema}.streams x
    WHERE x.pending AND NOT x.blocked
      AND coalesce(x.next_attempt, x.pending_since) <= now()
      AND (x.leased_until IS NULL OR x.leased_until <= now())
      AND x.stream NOT IN (SELECT stream FROM due))`),
		// The claim and the fetch of the claimed streams' events in one
		// statement (ClaimFetch, AckClaim): one row per event ($4 per stream
		// at most, in version order), or one with the event's columns NULL
		// for a stream with none past its watermark, then the skipped row
		// as the claim has it. The events are those of the claim's
		// snapshot; one committed later is past the head the settle reads
		// again, so its stream stays pending.
		claimFetch: r.Replace(`WITH due AS MATERIALIZED (
    SELECT stream, leased_by AS prev_holder FROM {schema}.streams
    WHERE pending AND NOT blocked
      AND coalesce(next_attempt, pending_since) <= now()
      AND (leased_until IS NULL OR leased_until <= now())
    ORDER BY coalesce(next_attempt, pending_since)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.streams s
    SET leased_by = $1, leased_until = now() + $3::bigint * interval '1 microsecond', updated_at = now()
    FROM due WHERE s.stream = due.stream
    RETURNING s.stream, s.watermark, s.retry, s.leased_until, coalesce(due.prev_holder, '') AS prev_holder
)
(SELECT c.stream, c.watermark, c.retry, c.leased_until, c.prev_holder, false AS skipped,
    e.id, e.version, e.name, e.data, e.meta, e.created
FROM claimed c
LEFT JOIN LATERAL (
    SELECT ev.id, ev.version, ev.name, ev.data::text AS data, ev.meta::text AS meta, ev.created
    FROM {events} ev
    WHERE ev.stream = c.stream AND ev.version > c.watermark
    ORDER BY ev.version
    LIMIT $4
) e ON true
ORDER BY c.stream, e.version)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, true, NULL, NULL, NULL, NULL, NULL, NULL
WHERE (SELECT count(*) FROM due) < $2 AND EXISTS (
    SELECT 1 FROM {schema}.streams x
    WHERE x.pending AND NOT x.blocked
      AND coalesce(x.next_attempt, x.pending_since) <= now()
      AND (x.leased_until IS NULL OR x.leased_until <= now())
      AND x.stream NOT IN (SELECT stream FROM due))`),
		// data and meta are read as text whatever their type (jsonb and json
		// print their JSON; text is as stored), so no row can fail the scan:
		// the store checks each event on its own (see scanEvent). Only the
		// columns read are selected: an app's table may have more.
		fetch: r.Replace(`SELECT e.id, e.stream, e.version, e.name, e.data, e.meta, e.created
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(stream, watermark, ord)
CROSS JOIN LATERAL (
    SELECT ev.id, ev.stream, ev.version, ev.name, ev.data::text AS data, ev.meta::text AS meta, ev.created
    FROM {events} ev
    WHERE ev.stream = c.stream AND ev.version > c.watermark
    ORDER BY ev.version
    LIMIT $3
) e
ORDER BY c.ord, e.version`),

		// Settling statements are fenced by the live lease ($1 owner, $2
		// stream) and move the watermark forward only. When events are left
		// past the new watermark, pending_since moves to the oldest of them
		// (one index probe), or to now() when the statement cannot see it (an
		// append that committed while the settle waited for its row).
		ack: r.Replace(`UPDATE {schema}.streams s
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    {settle_head},
    retry = 0, next_attempt = NULL, error = NULL,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		ackMany: ackManyQuery(r),
		retry: r.Replace(`UPDATE {schema}.streams s
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    {settle_head},
    retry = retry + 1, next_attempt = now() + $5::bigint * interval '1 microsecond', error = $6,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		// Like retry without counting one; the lease is ended (expired
		// now), not released: the next claim then names this owner as the
		// previous holder and reconciles, as after a takeover.
		postpone: r.Replace(`UPDATE {schema}.streams s
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    {settle_head},
    next_attempt = now() + $5::bigint * interval '1 microsecond', error = $6,
    leased_until = now(), updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		block: r.Replace(`UPDATE {schema}.streams s
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    {settle_head},
    retry = retry + 1, blocked = true, error = $5,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		// After a statement that moved watermarks forward, in its
		// transaction: an append to a stream that was pending wrote
		// nothing to its row (migration 008), only locked it, and the
		// settle, which waited for that lock, computed the row with a
		// snapshot from before the append committed. This statement's
		// snapshot is taken after the settle holds the rows ($1, the
		// streams settled), so it sees every such append, and marks
		// pending again each stream it left caught up with events past
		// its watermark. A row another transaction holds is one the
		// settle did not touch (it left it alone, SKIP LOCKED): skipped.
		catchUp: r.Replace(`UPDATE {schema}.streams s
SET head = t.top,
    pending_since = coalesce((
        SELECT LEAST(e.created, now()) FROM {events} e
        WHERE e.stream = s.stream AND e.version > s.watermark
        ORDER BY e.version LIMIT 1), now()),
    updated_at = now()
FROM (
    SELECT x.stream FROM {schema}.streams x
    WHERE x.stream = ANY($1) AND NOT x.pending
      AND EXISTS (SELECT 1 FROM {events} e WHERE e.stream = x.stream AND e.version > x.watermark)
    FOR NO KEY UPDATE SKIP LOCKED
) l
CROSS JOIN LATERAL (SELECT max(e.version) AS top FROM {events} e WHERE e.stream = l.stream) t
WHERE s.stream = l.stream AND t.top > s.watermark`),
		wake: r.Replace(`SELECT pg_notify('{schema}', '')`),
		// The idle lock ($1: idleLockKey) on the listening session: taken
		// exclusively ("mine"); else held shared by appenders that sent
		// no notification ("appending": the shared try succeeds, and is
		// undone at once) or held by another drainer ("other"). CASE
		// evaluates its branches in order.
		idleTake: `SELECT CASE WHEN pg_try_advisory_lock(k) THEN 'mine'
    WHEN pg_try_advisory_lock_shared(k) THEN CASE WHEN pg_advisory_unlock_shared(k) THEN 'appending' END
    ELSE 'other' END
FROM (SELECT hashtextextended($1, 0) AS k) x`,
		// The idle lock taken waiting in its queue behind the appenders
		// that hold it shared, for the session's lock_timeout at most.
		idleWait:  `SELECT pg_advisory_lock(hashtextextended($1, 0))`,
		idleLetGo: `SELECT pg_advisory_unlock(hashtextextended($1, 0))`,
		release: r.Replace(`UPDATE {schema}.streams
SET leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = ANY($2) AND leased_by = $1 AND leased_until > now()
RETURNING stream`),
		// Ends (expires now, holder kept) every live lease $1 holds but
		// those on $2: the next claim takes them at once and, naming $1
		// as the previous holder, reconciles. Rows another transaction
		// holds (an application's, a settle's) are skipped, never waited
		// for, and come back with busy set, to be tried again. No index on
		// leased_by: it runs only after a store call failed.
		endLeases: r.Replace(`WITH mine AS (
    SELECT stream FROM {schema}.streams
    WHERE leased_by = $1 AND leased_until > now() AND NOT (stream = ANY($2))
), ended AS (
    UPDATE {schema}.streams s
    SET leased_until = now(), updated_at = now()
    FROM (
        SELECT stream FROM {schema}.streams
        WHERE leased_by = $1 AND leased_until > now() AND NOT (stream = ANY($2))
        FOR UPDATE SKIP LOCKED
    ) l
    WHERE s.stream = l.stream
    RETURNING s.stream
)
SELECT stream, false FROM ended
UNION ALL
SELECT stream, true FROM mine WHERE stream NOT IN (SELECT stream FROM ended)`),

		// Ages are on the database clock and never negative: a created in
		// the future (an app writing its own clock's time) counts as 0.
		// GREATEST ignores NULL, so no event gives 0 too.
		streams: r.Replace(`SELECT s.stream, s.watermark, {real_head}, GREATEST({real_head} - s.watermark, 0),
    GREATEST((extract(epoch FROM now() - o.created) * 1e6)::bigint, 0),
    s.retry, s.next_attempt, s.blocked, coalesce(s.error, ''), coalesce(s.leased_by, ''), s.leased_until
FROM {schema}.streams s
LEFT JOIN LATERAL (
    SELECT e.created FROM {events} e
    WHERE e.stream = s.stream AND e.version > s.watermark
    ORDER BY e.version LIMIT 1
) o ON s.head > s.watermark
WHERE (NOT $1 OR s.blocked)
  AND (NOT $2 OR s.head > s.watermark)
  AND ($3 = '' OR s.stream ~ $3)
  AND ($5::text[] IS NULL OR s.stream = ANY($5))
ORDER BY s.stream
LIMIT NULLIF($4, 0)`),
		unblock: r.Replace(`WITH old AS MATERIALIZED (
    SELECT stream, blocked, error FROM {schema}.streams
    WHERE stream = ANY($1)
      AND (blocked OR retry > 0 OR error IS NOT NULL OR next_attempt IS NOT NULL)
    ORDER BY stream -- the lock order of the appends' multi-stream statements
    FOR UPDATE
)
UPDATE {schema}.streams s
SET blocked = false, error = NULL, retry = 0, next_attempt = NULL, updated_at = now()
FROM old WHERE s.stream = old.stream
RETURNING s.stream, s.watermark, {real_head}, old.blocked, coalesce(old.error, '')`),
		unblockMatch: r.Replace(`WITH old AS MATERIALIZED (
    SELECT stream, blocked, error FROM {schema}.streams
    WHERE ($1 = '' OR stream ~ $1)
      AND (blocked OR retry > 0 OR error IS NOT NULL OR next_attempt IS NOT NULL)
    ORDER BY stream -- the lock order of the appends' multi-stream statements
    FOR UPDATE
)
UPDATE {schema}.streams s
SET blocked = false, error = NULL, retry = 0, next_attempt = NULL, updated_at = now()
FROM old WHERE s.stream = old.stream
RETURNING s.stream, s.watermark, {real_head}, old.blocked, coalesce(old.error, '')`),
		// Reset also drops any lease, so a drainer still holding the stream
		// cannot move the watermark past the reset.
		reset: r.Replace(`WITH old AS MATERIALIZED (
    SELECT stream, watermark, blocked, error FROM {schema}.streams
    WHERE stream = ANY($1)
    ORDER BY stream -- the lock order of the appends' multi-stream statements
    FOR UPDATE
)
UPDATE {schema}.streams s
SET watermark = -1, watermark_id = NULL, blocked = false, error = NULL, retry = 0,
    next_attempt = NULL, leased_by = NULL, leased_until = NULL, updated_at = now()
FROM old WHERE s.stream = old.stream
RETURNING s.stream, old.watermark, {real_head}, old.blocked, coalesce(old.error, '')`),
		backlog: r.Replace(`SELECT
    (SELECT count(*) FROM {schema}.streams WHERE blocked),
    (SELECT count(*) FROM {schema}.streams WHERE pending AND NOT blocked),
    GREATEST((
        SELECT (extract(epoch FROM now() - min(o.created)) * 1e6)::bigint
        FROM {schema}.streams s
        CROSS JOIN LATERAL (
            SELECT e.created FROM {events} e
            WHERE e.stream = s.stream AND e.version > s.watermark
            ORDER BY e.version LIMIT 1
        ) o
        WHERE ((s.head > s.watermark AND NOT s.blocked) OR s.blocked) AND s.head > s.watermark
    ), 0)`),
		totals: r.Replace(`SELECT coalesce(sum({real_head} + 1), 0)::bigint, coalesce(sum(s.watermark + 1), 0)::bigint FROM {schema}.streams s`),

		// One page of a stream for verify, read as fetch reads it (data and
		// meta as text), so the audit compares what the drain published.
		streamEvents: r.Replace(`SELECT e.id, e.stream, e.version, e.name, e.data::text AS data, e.meta::text AS meta, e.created
FROM {events} e
WHERE e.stream = $1 AND e.version > $2 AND e.version <= $3
  AND ($4::timestamptz IS NULL OR e.created >= $4)
ORDER BY e.version
LIMIT $5`),
	}
}
