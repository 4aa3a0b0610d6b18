-- 003: discovery of new events in an existing events table (--events-table),
-- which has no trigger of ours: the scan position per events table and the
-- scans whose writers may still commit events below it; and an index so the
-- blocked-streams gauge does not read every stream.

CREATE TABLE IF NOT EXISTS {schema}.discovery (
    events_table text        PRIMARY KEY,
    low          bigint      NOT NULL DEFAULT 0,
    seen         bigint      NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {schema}.discovery_pending (
    events_table text   NOT NULL,
    hi           bigint NOT NULL,
    writers      text[] NOT NULL,
    PRIMARY KEY (events_table, hi)
);

CREATE INDEX IF NOT EXISTS streams_blocked_idx
    ON {schema}.streams (stream) WHERE blocked;
