package store

import "strings"

// queries holds every statement the store runs, with the schema injected
// once at construction (the schema is a validated plain identifier).
type queries struct {
	createSchema     string
	createMigrations string
	migrationLock    string
	appliedVersions  string
	recordMigration  string

	head         string
	insertEvents string

	claim   string
	fetch   string
	ack     string
	retry   string
	block   string
	release string

	streams string
	unblock string
	reset   string
	totals  string
}

func newQueries(schema string) queries {
	r := strings.NewReplacer("{schema}", schema)
	return queries{
		createSchema: r.Replace(`CREATE SCHEMA IF NOT EXISTS {schema}`),
		createMigrations: r.Replace(`CREATE TABLE IF NOT EXISTS {schema}.jsbridge_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)`),
		// Transaction-scoped: released at commit or rollback, even when the
		// connection dies.
		migrationLock:   `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		appliedVersions: r.Replace(`SELECT version FROM {schema}.jsbridge_migrations`),
		recordMigration: r.Replace(`INSERT INTO {schema}.jsbridge_migrations (version) VALUES ($1)`),

		head: r.Replace(`SELECT coalesce(max(version), -1) FROM {schema}.events WHERE stream = $1`),
		// ORDER BY ord makes identity ids follow versions within the append.
		insertEvents: r.Replace(`INSERT INTO {schema}.events (stream, version, name, data, meta)
SELECT $1, $2 + t.ord, t.name, t.data::jsonb, t.meta::jsonb
FROM unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS t(name, data, meta, ord)
ORDER BY t.ord
RETURNING id, version, name, data, meta, created`),

		// The locking select is materialized so it runs exactly once; SKIP
		// LOCKED means competing claimers never wait for each other.
		claim: r.Replace(`WITH pending AS MATERIALIZED (
    SELECT stream, leased_by AS prev_holder FROM {schema}.streams
    WHERE head > watermark AND NOT blocked
      AND (next_attempt IS NULL OR next_attempt <= now())
      AND (leased_until IS NULL OR leased_until <= now())
    ORDER BY next_attempt NULLS FIRST
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.streams s
SET leased_by = $1, leased_until = now() + $3::bigint * interval '1 microsecond', updated_at = now()
FROM pending WHERE s.stream = pending.stream
RETURNING s.stream, s.watermark, s.retry, s.leased_until, coalesce(pending.prev_holder, '')`),
		fetch: r.Replace(`SELECT e.id, e.stream, e.version, e.name, e.data, e.meta, e.created
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(stream, watermark, ord)
CROSS JOIN LATERAL (
    SELECT * FROM {schema}.events ev
    WHERE ev.stream = c.stream AND ev.version > c.watermark
    ORDER BY ev.version
    LIMIT $3
) e
ORDER BY c.ord, e.version`),

		// Settling statements are fenced by the live lease ($1 owner, $2
		// stream) and move the watermark forward only.
		ack: r.Replace(`UPDATE {schema}.streams
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    retry = 0, next_attempt = NULL, error = NULL,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		retry: r.Replace(`UPDATE {schema}.streams
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    retry = retry + 1, next_attempt = now() + $5::bigint * interval '1 microsecond', error = $6,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		block: r.Replace(`UPDATE {schema}.streams
SET watermark = GREATEST(watermark, $3),
    watermark_id = CASE WHEN $3 > watermark THEN $4 ELSE watermark_id END,
    retry = retry + 1, blocked = true, error = $5,
    leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = $2 AND leased_by = $1 AND leased_until > now()`),
		release: r.Replace(`UPDATE {schema}.streams
SET leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = ANY($2) AND leased_by = $1 AND leased_until > now()
RETURNING stream`),

		streams: r.Replace(`SELECT s.stream, s.watermark, s.head, GREATEST(s.head - s.watermark, 0),
    coalesce((extract(epoch FROM now() - o.created) * 1e6)::bigint, 0),
    s.retry, s.next_attempt, s.blocked, coalesce(s.error, ''), coalesce(s.leased_by, ''), s.leased_until
FROM {schema}.streams s
LEFT JOIN LATERAL (
    SELECT e.created FROM {schema}.events e
    WHERE e.stream = s.stream AND e.version > s.watermark
    ORDER BY e.version LIMIT 1
) o ON s.head > s.watermark
WHERE (NOT $1 OR s.blocked)
  AND (NOT $2 OR s.head > s.watermark)
  AND ($3 = '' OR s.stream ~ $3)
ORDER BY s.stream
LIMIT NULLIF($4, 0)`),
		unblock: r.Replace(`UPDATE {schema}.streams
SET blocked = false, error = NULL, retry = 0, next_attempt = NULL, updated_at = now()
WHERE stream = ANY($1)
  AND (blocked OR retry > 0 OR error IS NOT NULL OR next_attempt IS NOT NULL)
RETURNING stream`),
		// Reset also drops any lease, so a drainer still holding the stream
		// cannot move the watermark past the reset.
		reset: r.Replace(`UPDATE {schema}.streams
SET watermark = -1, watermark_id = NULL, blocked = false, error = NULL, retry = 0,
    next_attempt = NULL, leased_by = NULL, leased_until = NULL, updated_at = now()
WHERE stream = ANY($1)
RETURNING stream`),
		totals: r.Replace(`SELECT coalesce(sum(head + 1), 0)::bigint, coalesce(sum(watermark + 1), 0)::bigint FROM {schema}.streams`),
	}
}
