-- 001: the bridge's per-stream table: head (last committed version),
-- watermark (last forwarded), retry and backoff, block, lease. {schema} is
-- replaced by the store's schema name.

CREATE TABLE IF NOT EXISTS {schema}.streams (
    stream       text        PRIMARY KEY,
    watermark    bigint      NOT NULL DEFAULT -1,
    watermark_id bigint,
    head         bigint      NOT NULL DEFAULT -1,
    retry        integer     NOT NULL DEFAULT 0,
    next_attempt timestamptz,
    blocked      boolean     NOT NULL DEFAULT false,
    error        text,
    leased_by    text,
    leased_until timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Only streams with work to do are in this index, so a claim's cost does not
-- grow with idle or blocked streams.
CREATE INDEX IF NOT EXISTS streams_pending_idx
    ON {schema}.streams (next_attempt NULLS FIRST)
    WHERE head > watermark AND NOT blocked;
