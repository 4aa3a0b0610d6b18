-- 009: a stream the drain catches up stays in the claim's index for a
-- while, so that an append to it soon after writes nothing.
--
-- Until now an ack that caught a stream up took it out of the claim's
-- index (pending went false: a non-HOT update) and the stream's next
-- append put it back (another non-HOT update, and the notification's
-- decision): with the drain keeping up, two non-HOT updates of the
-- streams row for nearly every event. Now pending is head > watermark OR
-- keep_pending, and on the bridge's own events table the ack sets
-- keep_pending: the stream stays in the index, caught up (its head
-- column at its watermark), and the ack is a HOT update when nothing
-- else indexed moves. An append to such a lingering stream finds it
-- pending and writes nothing, as an append to any pending stream does
-- since migration 008. A claim takes a lingering stream only when an
-- event is past its watermark (one probe of the events table's index
-- for each lingering stream it passes), and claims take out of the
-- index (keep_pending false) the streams that lingered longer than the
-- store's linger time without an append (store/sql.go: takeOut). Lag,
-- bridge streams, the backlog gauges and reset count a lingering stream
-- as caught up unless an event is past its watermark. Retry, postpone
-- and block clear keep_pending: pending is then head > watermark, as
-- before.
--
-- On an external events table (no trigger) nothing sets keep_pending:
-- pending is head > watermark, as before.
--
-- Re-adding the generated column rewrites the table once under an
-- exclusive lock, as migration 005 did (6.5 s for a million streams on a
-- busy 2-core machine). Upgrade the bridges together: an older bridge's
-- claim would take a lingering stream with no event past its watermark
-- and retry it, then block it ("no events after watermark").
ALTER TABLE {schema}.streams ADD COLUMN IF NOT EXISTS keep_pending boolean NOT NULL DEFAULT false;
-- Drops streams_claimable_idx with it.
ALTER TABLE {schema}.streams DROP COLUMN IF EXISTS pending;
ALTER TABLE {schema}.streams ADD COLUMN pending boolean
    GENERATED ALWAYS AS (head > watermark OR keep_pending) STORED;
CREATE INDEX IF NOT EXISTS streams_claimable_idx
    ON {schema}.streams ((coalesce(next_attempt, pending_since)))
    WHERE pending AND NOT blocked;

-- jsbridge:own-events-table
-- The rest only with the bridge's own events table.

-- Migration 008's trigger, with one change: an append to a lingering
-- stream (pending, its head column not past its watermark: caught up
-- when it was last settled) writes nothing either, but decides on a
-- notification as an append that makes a caught-up stream pending does
-- (a drainer waiting for one gets it; otherwise the appender holds the
-- idle lock shared until it commits, so a drainer's last claim before it
-- waits comes after this append, and that claim probes the lingering
-- stream). An upsert of a lingering stream (a statement of several
-- streams) gives it this append's pending_since and decides on a
-- notification, as for a caught-up stream (the test is on the head
-- column, unchanged).
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- not named like a column of the statements below
    lo_stream text;
    hi_stream text;
    top_version bigint;
    oldest timestamptz;
    already boolean;
    lingering boolean;
    wake boolean;
BEGIN
    -- After a wait for the lock, the row read is the one the lock holder
    -- committed (READ COMMITTED rechecks a locked row's newest version).
    -- No row: a new stream, or several streams' events (or none).
    SELECT s.pending, s.head <= s.watermark
            AND NOT s.blocked AND coalesce(s.next_attempt <= now(), true) AND coalesce(s.leased_until <= now(), true),
        t.lo, t.hi, t.top, t.oldest
    INTO already, lingering, lo_stream, hi_stream, top_version, oldest
    FROM (SELECT min(n.stream) AS lo, max(n.stream) AS hi, max(n.version) AS top,
            LEAST(min(n.created), now()) AS oldest
        FROM new_events n) t
    JOIN {schema}.streams s ON s.stream = t.lo AND t.lo = t.hi
    FOR NO KEY UPDATE OF s;
    IF already THEN
        -- pending: a claim will take this event with the others; lingering:
        -- a claim takes it once it sees this event
        IF lingering AND NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
            PERFORM pg_notify('{schema}', '');
        END IF;
        RETURN NULL;
    ELSIF already IS NULL THEN
        SELECT min(n.stream), max(n.stream), max(n.version), LEAST(min(n.created), now())
        INTO lo_stream, hi_stream, top_version, oldest FROM new_events n;
    END IF;
    IF lo_stream IS NULL THEN
        RETURN NULL; -- no row inserted
    ELSIF lo_stream = hi_stream THEN
        INSERT INTO {schema}.streams AS s (stream, head, pending_since)
        VALUES (lo_stream, top_version, oldest)
        ON CONFLICT (stream) DO UPDATE
            SET head = GREATEST(s.head, EXCLUDED.head),
                pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
                updated_at = now()
        RETURNING s.pending_since = oldest -- caught up until this append
            AND NOT s.blocked AND coalesce(s.next_attempt <= now(), true) AND coalesce(s.leased_until <= now(), true)
        INTO wake;
    ELSE
        WITH n AS (
            SELECT n.stream, max(n.version) AS head, LEAST(min(n.created), now()) AS since
            FROM new_events n GROUP BY n.stream
        ), up AS (
            INSERT INTO {schema}.streams AS s (stream, head, pending_since)
            SELECT stream, head, since FROM n
            ORDER BY stream -- a fixed lock order across concurrent multi-stream inserts
            ON CONFLICT (stream) DO UPDATE
                SET head = GREATEST(s.head, EXCLUDED.head),
                        pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
                    updated_at = now()
            RETURNING s.stream, s.pending_since, s.blocked, s.next_attempt, s.leased_until
        )
        SELECT bool_or(up.pending_since = n.since -- caught up (or lingering) until this append
            AND NOT up.blocked AND coalesce(up.next_attempt <= now(), true) AND coalesce(up.leased_until <= now(), true))
        INTO wake FROM up JOIN n USING (stream);
    END IF;
    IF wake AND NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
