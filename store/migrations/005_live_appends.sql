-- 005: a cheaper append. The trigger's update of a stream that is already
-- pending can be a HOT update (no index touched), and the trigger notifies
-- only when the append makes a caught-up stream pending.

-- Room on every page for new versions of its rows, so an update of a row
-- finds space beside it (a HOT update needs the same page). Takes effect
-- for the pages written from now on, and for every page with the rewrite
-- below.
ALTER TABLE {schema}.streams SET (fillfactor = 70);

-- A HOT update is possible only when no column an index uses changes. The
-- claim's index had head in its predicate, so every append, which moves
-- the head, inserted a new entry into each index of the table. pending
-- changes only when the stream goes from caught up to pending and back;
-- head moving within pending leaves every indexed column as it was.
-- Adding a stored generated column rewrites the table once (under an
-- exclusive lock: 6.5 s for a million streams on a busy 2-core machine).
ALTER TABLE {schema}.streams ADD COLUMN IF NOT EXISTS pending boolean
    GENERATED ALWAYS AS (head > watermark) STORED;

DROP INDEX IF EXISTS {schema}.streams_due_idx;
CREATE INDEX IF NOT EXISTS streams_claimable_idx
    ON {schema}.streams ((coalesce(next_attempt, pending_since)))
    WHERE pending AND NOT blocked;

-- jsbridge:own-events-table
-- The rest only with the bridge's own events table.

-- The head and pending_since as before (an update of a pending stream
-- writes neither pending_since nor any other indexed column). The
-- notification now goes out only when an append makes a stream go from
-- caught up to pending (its pending_since is then this append's) and a
-- claim can take it: it is not blocked, not in backoff, and no drainer
-- holds a live lease on it. An append to a stream that is already pending
-- adds to work that some drainer will take anyway:
--   - whatever made the stream pending woke a drainer (a notification like
--     this one, a settle that left events past the watermark, after which
--     that drainer claims again at once, or the poll that finds streams out
--     of backoff); the claim it leads to takes this append's event too, if
--     it runs after this transaction commits;
--   - a claim that runs before the commit passes over the stream (its row
--     is locked: FOR UPDATE SKIP LOCKED) and says so, and the store then
--     wakes the drain again a moment later (Store.Notifications);
--   - a live lease: its holder settles the stream after publishing (the
--     settle waits for this row lock, so it sees the new head and leaves
--     the stream pending) and, because that cycle claimed something, claims
--     again at once (drain.Run waits for a notification only after a cycle
--     that claimed nothing). A holder that died leaves a lease that only
--     its expiry ends, which no notification could hasten;
--   - blocked or in backoff: no claim takes it before an unblock or its
--     next attempt time, which the drain finds by polling, as before.
-- Each notification takes Postgres' commit-wide notify lock (serializing
-- the commits of concurrent appenders) and costs every listening bridge a
-- transaction to read it.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    wake boolean;
BEGIN
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
    IF wake THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
