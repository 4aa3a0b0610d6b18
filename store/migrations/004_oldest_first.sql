-- 004: claims serve streams oldest first. pending_since is when the stream's
-- oldest unforwarded event was appended (its created, never later than the
-- database's now()); a stream in backoff is due at next_attempt instead. A
-- claim takes the streams due longest, so under a backlog each waits about
-- as long as the others.

-- A constant default (now() is evaluated once): no table rewrite. Streams
-- already pending rank by the migration's time, ahead of anything appended
-- later (with the bridge's own events table, by their oldest event: the
-- last part).
ALTER TABLE {schema}.streams ADD COLUMN IF NOT EXISTS pending_since timestamptz NOT NULL DEFAULT now();

-- The claim's index: still only streams with work to do (so idle and blocked
-- streams cost nothing), now in the order claims take them; a claim's scan
-- stops at the first stream not yet due.
DROP INDEX IF EXISTS {schema}.streams_pending_idx;
CREATE INDEX IF NOT EXISTS streams_due_idx
    ON {schema}.streams ((coalesce(next_attempt, pending_since)))
    WHERE head > watermark AND NOT blocked;

-- jsbridge:own-events-table
-- The rest only with the bridge's own events table (an existing one, from
-- --events-table, is never read or changed by a migration).

UPDATE {schema}.streams s
SET pending_since = coalesce((
    SELECT LEAST(e.created, now()) FROM {schema}.events e
    WHERE e.stream = s.stream AND e.version > s.watermark
    ORDER BY e.version LIMIT 1), now())
WHERE s.head > s.watermark;

-- The trigger also sets pending_since when a stream goes from caught up to
-- pending: the same statement and the same row lock as before.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.streams AS s (stream, head, pending_since)
    SELECT n.stream, max(n.version), LEAST(min(n.created), now()) FROM new_events n GROUP BY n.stream
    ORDER BY n.stream -- a fixed lock order across concurrent multi-stream inserts
    ON CONFLICT (stream) DO UPDATE
        SET head = GREATEST(s.head, EXCLUDED.head),
            pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
            updated_at = now();
    PERFORM pg_notify('{schema}', '');
    RETURN NULL;
END
$$;
