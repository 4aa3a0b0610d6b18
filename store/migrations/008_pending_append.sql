-- jsbridge:own-events-table
-- 008: an append to a stream that is already pending writes nothing to
-- the streams table. Until now every append upserted its stream's row (a
-- HOT update when the stream was pending: about 40µs of the trigger's
-- 48µs in a loop of one-event appends). Now the trigger of a one-stream
-- statement first locks the stream's row (FOR NO KEY UPDATE: no new row
-- version, no index entry, nothing for vacuum) and reads whether it is
-- pending; if it is, it stops there. The head in the streams table is
-- then a lower bound of the stream's last version while the stream is
-- pending, and exact once it is caught up (head = watermark); whatever
-- needs the real head of a pending stream reads it from the events table
-- (store/sql.go: realHead).
--
-- What keeps "pending exactly when a committed event is past the
-- watermark" true: the row lock is held until the append commits, and
-- every statement that moves a watermark forward (ack, retry, postpone,
-- block) waits for it (it updates the row) and is followed, in its
-- transaction, by a statement that looks again, with a snapshot taken
-- after it holds the row, at the events past the new watermark and marks
-- the stream pending when there are any (store/sql.go: catchUp). So an
-- append that skipped the write has committed before that look, or
-- started after the settle took the row and waits for it to commit: it
-- then reads the row as the settle left it, caught up, and marks it
-- pending itself. A claim (FOR UPDATE SKIP LOCKED) passes over a row an
-- appender holds, as it did when the appender updated it.
--
-- The rest is migration 007's: a statement of several streams, or one
-- that makes a caught-up (or new) stream pending, upserts the rows and
-- decides on a notification.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- not named like a column of the statements below
    lo_stream text;
    hi_stream text;
    top_version bigint;
    oldest timestamptz;
    already boolean;
    wake boolean;
BEGIN
    -- After a wait for the lock, the row read is the one the lock holder
    -- committed (READ COMMITTED rechecks a locked row's newest version).
    -- No row: a new stream, or several streams' events (or none).
    SELECT s.pending, t.lo, t.hi, t.top, t.oldest
    INTO already, lo_stream, hi_stream, top_version, oldest
    FROM (SELECT min(n.stream) AS lo, max(n.stream) AS hi, max(n.version) AS top,
            LEAST(min(n.created), now()) AS oldest
        FROM new_events n) t
    JOIN {schema}.streams s ON s.stream = t.lo AND t.lo = t.hi
    FOR NO KEY UPDATE OF s;
    IF already THEN
        RETURN NULL; -- pending: a claim will take this event with the others
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
