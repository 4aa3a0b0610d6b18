-- jsbridge:own-events-table
-- 007: a cheaper trigger for the appends store.Append and store.AppendTx
-- make: one statement inserting one stream's events, most often one.
-- The same rules as migration 006 (the head and pending_since move in the
-- appending transaction; a notification only when the append makes a
-- caught-up stream pending, a claim can take it and a drainer holds the
-- idle lock), and the same statement-level trigger.
--
-- Migration 006 grouped the transition table by stream, upserted the
-- streams rows from the groups and joined the upsert's rows back to the
-- groups to decide on a notification; for one stream that machinery cost
-- about as much as the upsert itself. Now one pass over the transition
-- table finds whether the statement inserted one stream's events, and
-- then a single-row upsert's RETURNING decides on the notification.
-- Statements inserting several streams' events take 006's way, which
-- locks their rows in stream order. Figures: docs/performance.md, issue 33.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- not named like a column of the statements below
    lo_stream text;
    hi_stream text;
    top_version bigint;
    oldest timestamptz;
    wake boolean;
BEGIN
    SELECT min(n.stream), max(n.stream), max(n.version), LEAST(min(n.created), now())
    INTO lo_stream, hi_stream, top_version, oldest FROM new_events n;
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
        SELECT bool_or(up.pending_since = n.since -- caught up until this append
            AND NOT up.blocked AND coalesce(up.next_attempt <= now(), true) AND coalesce(up.leased_until <= now(), true))
        INTO wake FROM up JOIN n USING (stream);
    END IF;
    IF wake AND NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
