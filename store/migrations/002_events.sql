-- jsbridge:own-events-table
-- 002: the bridge's own events table of the common event-store layout and the
-- trigger that keeps each stream's head current and wakes the drain. Skipped
-- when the bridge drains an existing table (--events-table): that table and
-- its program are left untouched.

CREATE TABLE IF NOT EXISTS {schema}.events (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream  text        NOT NULL,
    version bigint      NOT NULL,
    name    text        NOT NULL,
    data    jsonb       NOT NULL,
    meta    jsonb       NOT NULL DEFAULT '{}',
    created timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, version)
);

-- One statement-level trigger: the head moves in the inserting transaction
-- (so head > watermark exactly when a committed event is past the watermark),
-- and one notification per statement wakes the drain after commit.
CREATE OR REPLACE FUNCTION {schema}.jsbridge_events_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.streams AS s (stream, head)
    SELECT n.stream, max(n.version) FROM new_events n GROUP BY n.stream
    ORDER BY n.stream -- a fixed lock order across concurrent multi-stream inserts
    ON CONFLICT (stream) DO UPDATE
        SET head = GREATEST(s.head, EXCLUDED.head), updated_at = now();
    PERFORM pg_notify('{schema}', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jsbridge_events_inserted ON {schema}.events;
CREATE TRIGGER jsbridge_events_inserted
    AFTER INSERT ON {schema}.events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jsbridge_events_inserted();
