-- jsbridge:own-events-table
-- 009: while no drainer waits, an append writes one row per event into an
-- unindexed table (appended) and touches no streams row; the bridge takes
-- those rows into the streams table (Store's fold, store/fold.go) at the
-- start of every claim. Until now an append to a caught-up stream, nearly
-- every append when the drain keeps up over many streams, upserted its
-- streams row (a non-HOT update: the row enters the claim's index) and
-- locked it to its commit, so appenders waited for rows the bridge held
-- and paid 1.7-1.8 times the insert without the trigger; the marker costs
-- an insert into a table with no index (figures: docs/performance.md).
--
-- What keeps "a committed event past the watermark is claimable": the
-- stream's row is pending, or a committed marker names the event, and
-- every claim (Claim, ClaimFetch, AckClaim) runs the fold first in its
-- transaction, so it sees every marker committed before it. A marker
-- committed after that claim was written by an append that holds the idle
-- lock shared to its commit (it took it to learn that no drainer waits):
-- a drainer that goes idle takes the lock only after that commit and
-- claims once more, so the fold of that claim takes the marker; a drainer
-- that does not go idle claims again anyway.
--
-- While a drainer waits (the shared try fails: it holds the idle lock),
-- the append does what migration 008 did, so that it can tell whether to
-- wake it: it locks and reads the stream's row and stops when the stream
-- is pending, else upserts it and notifies when a claim can take it. So
-- notifications go out as before: only while a drainer waits, and only
-- when the append makes a caught-up stream pending and claimable.
CREATE TABLE IF NOT EXISTS {schema}.appended (
    stream  text        NOT NULL,
    version bigint      NOT NULL,
    created timestamptz NOT NULL
);

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
    IF pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        -- No drainer waits; the lock, held to the commit, keeps one from
        -- going idle before this marker is visible to its last claim.
        INSERT INTO {schema}.appended (stream, version, created)
        SELECT n.stream, n.version, n.created FROM new_events n;
        RETURN NULL;
    END IF;
    -- A drainer waits: migration 008's way. After a wait for the lock, the
    -- row read is the one the lock holder committed. No row: a new
    -- stream, or several streams' events (or none).
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
    IF wake THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
