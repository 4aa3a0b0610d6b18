-- jsbridge:own-events-table
-- 006: an append notifies only while a drainer waits for notifications.
--
-- A drainer that finds nothing to claim takes the session advisory lock
-- (jsbridge idle, schema) exclusively on its listening connection, claims
-- once more, and waits for a notification while it holds the lock; it
-- lets go of the lock when it finds work again (Store.Idle, Store.Busy).
-- An append that would wake a drainer (migration 005: it makes a caught-up
-- stream pending and a claim can take it) notifies only when it cannot
-- take that lock shared, that is when a drainer holds it. Otherwise it
-- holds the shared lock until its commit, so a drainer that goes to wait
-- takes the lock only after every such appender has committed, and the
-- claim it makes then sees their events. While a drainer works (with
-- --linger, or under a backlog, it never waits) appends send no
-- notification: no commit-wide notify lock, no transaction on the
-- drainers' listening connections.
--
-- A drainer that cannot take the lock because another drainer holds it
-- waits on that one's notifications (they reach every listener); one that
-- cannot because an appender holds it shared waits in the lock's queue
-- (50ms at most; appends notify meanwhile, as a shared try cannot jump
-- the queue) and claims once more. Each listening session of a drain has
-- its own hold on the lock, also with several drains on one Store. Bridges older than this migration never take the lock, so with
-- no new bridge running appends notify nobody and the old bridges find
-- new events by polling (--poll-interval) until they are upgraded.
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
    IF wake AND NOT pg_try_advisory_xact_lock_shared(hashtextextended('jsbridge idle {schema}', 0)) THEN
        PERFORM pg_notify('{schema}', '');
    END IF;
    RETURN NULL;
END
$$;
