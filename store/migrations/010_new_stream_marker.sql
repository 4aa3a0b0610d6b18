-- jsbridge:own-events-table
-- 010: while a drainer waits, an append to a stream that has no row yet
-- writes markers (as while no drainer waits) instead of inserting the row,
-- so that only the bridge's fold (store/fold.go) ever inserts a streams
-- row for the bridge's own table. Until now such an append inserted the
-- row and held it, uncommitted, to its commit; a fold that held rows of
-- its own (it locks the rows of the streams it takes in, in stream order,
-- never waiting) and then inserted the same new stream waited for that
-- appender, and an appender that then wanted one of the fold's rows (a
-- statement over several streams, or a second statement) closed a
-- deadlock cycle, in which Postgres could cancel the application's
-- append. Now an appender waits only for rows that exist (a fold's or a
-- settle's, which never wait for an appender while holding them), and a
-- fold waits only for another fold inserting the same new stream, the
-- folds inserting in stream order.
--
-- A stream with a row is handled as migration 009's second way did: an
-- append to a pending stream writes nothing, else it updates the row and
-- notifies when a claim can take it. A new stream's markers notify
-- always: the claim the notification brings folds them first, in its own
-- transaction, so it sees them (they committed before the notification
-- was sent). A statement over several streams locks their rows in stream
-- order (a fixed lock order, so two such statements never deadlock on
-- them) and writes markers for the streams without one.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- not named like a column of the statements below
    lo_stream text;
    top_version bigint;
    oldest timestamptz;
    already boolean;
    wake boolean;
BEGIN
    IF pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        -- No drainer waits; the lock, held to the commit, keeps one from
        -- going idle before this marker is visible to its last claim.
        INSERT INTO {schema}.appended (stream, version, created)
        SELECT n.stream, n.version, n.created FROM new_events n;
        RETURN NULL;
    END IF;
    -- A drainer waits. After a wait for the lock, the row read is the one
    -- the lock holder committed. No row: a new stream, or several
    -- streams' events (or none).
    SELECT s.pending, t.lo, t.top, t.oldest
    INTO already, lo_stream, top_version, oldest
    FROM (SELECT min(n.stream) AS lo, max(n.stream) AS hi, max(n.version) AS top,
            LEAST(min(n.created), now()) AS oldest
        FROM new_events n) t
    JOIN {schema}.streams s ON s.stream = t.lo AND t.lo = t.hi
    FOR NO KEY UPDATE OF s;
    IF already THEN
        RETURN NULL; -- pending: a claim will take this event with the others
    ELSIF NOT already THEN
        -- caught up (the row is locked above): pending from this append
        UPDATE {schema}.streams AS s
        SET head = GREATEST(s.head, top_version),
            pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE oldest END,
            updated_at = now()
        WHERE s.stream = lo_stream
        RETURNING s.pending_since = oldest -- caught up until this append
            AND NOT s.blocked AND coalesce(s.next_attempt <= now(), true) AND coalesce(s.leased_until <= now(), true)
        INTO wake;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM new_events) THEN
            RETURN NULL; -- no row inserted
        END IF;
        WITH n AS (
            SELECT n.stream, max(n.version) AS head, LEAST(min(n.created), now()) AS since
            FROM new_events n GROUP BY n.stream
        ), held AS MATERIALIZED (
            SELECT s.stream FROM {schema}.streams s
            WHERE s.stream IN (SELECT stream FROM n)
            ORDER BY s.stream -- a fixed lock order across concurrent multi-stream inserts
            FOR NO KEY UPDATE
        ), up AS (
            UPDATE {schema}.streams AS s
            SET head = GREATEST(s.head, n.head),
                pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE n.since END,
                updated_at = now()
            FROM n
            WHERE s.stream = n.stream AND s.stream IN (SELECT stream FROM held)
            RETURNING s.pending_since = n.since -- caught up until this append
                AND NOT s.blocked AND coalesce(s.next_attempt <= now(), true) AND coalesce(s.leased_until <= now(), true) AS wake
        ), fresh AS (
            -- streams without a row: the fold inserts it
            INSERT INTO {schema}.appended (stream, version, created)
            SELECT e.stream, e.version, e.created FROM new_events e
            WHERE e.stream NOT IN (SELECT stream FROM held)
            RETURNING 1
        )
        SELECT coalesce((SELECT bool_or(up.wake) FROM up), false) OR EXISTS (SELECT 1 FROM fresh)
        INTO wake;
    END IF;
    IF wake THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
