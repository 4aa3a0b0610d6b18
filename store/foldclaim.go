package store

import "strings"

// foldClaimFetchSQL is the fold (foldSQL), the claim and its fetch
// (claimFetch) in one statement, for the bridge's own events table
// (ClaimFetch, AckClaim): the streams the fold makes pending and
// claimable are leased by the fold's own write of their row, so such a
// stream's row is written once a claim instead of twice (the fold's
// upsert, then the claim's lock and update), and the cycle runs one
// statement fewer. $1 owner, $2 limit, $3 lease in µs, $4 events per
// stream, $5 most markers folded.
//
// A statement's parts share one snapshot, so the claim's scan (due) does
// not see what the fold writes. The parts are split so that no row is
// written twice:
//   - due claims, oldest first as the claim always did, the streams that
//     were due in the snapshot, the fold's included: their markers are
//     taken and their rows not written by the fold (a due stream is
//     pending, so the fold would only have raised its head, a lower bound
//     since migration 008; the ack reads the events again);
//   - the fold writes every other stream of its markers as foldSQL does
//     and, of those it leaves claimable (pending, not blocked, due, no
//     live lease, judged on the row it writes), leases the oldest in the
//     room the claim left ($2 less what due took). Under a backlog due
//     fills the claim and the fold leases none: those streams wait their
//     turn by age, as before.
//
// Rows: one per event of each claimed stream (the claim statement's
// columns, then the event's), or one with the event's columns NULL for a
// stream with none past its watermark, grouped by stream in version
// order; then always one last row with the stream NULL, saying whether
// the claim passed over a due stream whose row another transaction held
// (as claimFetch's skipped row), and the markers the fold read and those
// it left (as foldSQL returns them).
const foldClaimFetchSQL = `WITH m AS MATERIALIZED (
    SELECT a.ctid AS at, a.stream, a.version, a.created FROM {schema}.appended a
    LIMIT $5
    FOR UPDATE SKIP LOCKED
), mine AS MATERIALIZED (
    -- index probes of the streams named, never a scan of the table
    SELECT s.stream, s.leased_by FROM {schema}.streams s
    WHERE s.stream = ANY (ARRAY(SELECT DISTINCT stream FROM m))
    ORDER BY s.stream
    FOR NO KEY UPDATE SKIP LOCKED
), take AS MATERIALIZED (
    SELECT m.at, m.stream, m.version, m.created FROM m
    WHERE m.stream IN (SELECT stream FROM mine) -- a row this fold holds
       -- else (only then: OR stops at the first true) a new stream, with no row yet
       OR NOT EXISTS (SELECT 1 FROM {schema}.streams x WHERE x.stream = m.stream)
), gone AS (
    DELETE FROM {schema}.appended a WHERE a.ctid = ANY (ARRAY(SELECT at FROM take))
), due AS MATERIALIZED (
    SELECT stream, leased_by AS prev_holder FROM {schema}.streams
    WHERE pending AND NOT blocked
      AND coalesce(next_attempt, pending_since) <= now()
      AND (leased_until IS NULL OR leased_until <= now())
    ORDER BY coalesce(next_attempt, pending_since)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), f AS MATERIALIZED (
    -- the streams the fold writes: its own but those due claims
    SELECT stream, max(version) AS head, LEAST(min(created), now()) AS since FROM take
    WHERE stream NOT IN (SELECT stream FROM due)
    GROUP BY stream
), pick AS MATERIALIZED (
    -- the room due left, offered to the fold's streams, oldest first;
    -- the row's own state decides (up)
    SELECT stream FROM f
    ORDER BY since, stream
    LIMIT GREATEST($2 - (SELECT count(*) FROM due), 0)
), up AS (
    INSERT INTO {schema}.streams AS s (stream, head, pending_since, leased_by, leased_until)
    SELECT f.stream, f.head, f.since,
        CASE WHEN f.offered THEN $1 END,
        CASE WHEN f.offered THEN now() + $3::bigint * interval '1 microsecond' END
    FROM (SELECT f.*, f.stream IN (SELECT stream FROM pick) AS offered FROM f) f -- hashed: no loop over pick a stream
    ORDER BY f.stream -- a fixed lock order across concurrent folds
    ON CONFLICT (stream) DO UPDATE
        SET head = GREATEST(s.head, EXCLUDED.head),
            pending_since = CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END,
            {lease_if_claimable},
            updated_at = now()
    RETURNING s.stream, s.watermark, s.retry, s.leased_until,
        s.leased_by = $1 AND s.leased_until = now() + $3::bigint * interval '1 microsecond' AS taken
), claimed AS (
    UPDATE {schema}.streams s
    SET leased_by = $1, leased_until = now() + $3::bigint * interval '1 microsecond', updated_at = now()
    FROM due WHERE s.stream = due.stream
    RETURNING s.stream, s.watermark, s.retry, s.leased_until, coalesce(due.prev_holder, '') AS prev_holder
), c AS (
    -- the fold's first: reading up runs the fold (mine's locks included)
    -- before claimed writes due's rows, which mine would otherwise find
    -- written by this statement and pass over, leaving their markers
    SELECT u.stream, u.watermark, u.retry, u.leased_until, coalesce(x.leased_by, '') AS prev_holder
    FROM up u LEFT JOIN mine x USING (stream)
    WHERE u.taken
    UNION ALL
    SELECT stream, watermark, retry, leased_until, prev_holder FROM claimed
)
(SELECT c.stream, c.watermark, c.retry, c.leased_until, c.prev_holder, false AS skipped,
    e.id, e.version, e.name, e.data, e.meta, e.created, NULL::bigint AS read, NULL::bigint AS kept
FROM c
LEFT JOIN LATERAL (
    SELECT ev.id, ev.version, ev.name, ev.data::text AS data, ev.meta::text AS meta, ev.created
    FROM {events} ev
    WHERE ev.stream = c.stream AND ev.version > c.watermark
    ORDER BY ev.version
    LIMIT $4
) e ON true
ORDER BY c.stream, e.version)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL,
    (SELECT count(*) FROM c) < $2 AND EXISTS (
        SELECT 1 FROM {schema}.streams x
        WHERE x.pending AND NOT x.blocked
          AND coalesce(x.next_attempt, x.pending_since) <= now()
          AND (x.leased_until IS NULL OR x.leased_until <= now())
          AND x.stream NOT IN (SELECT stream FROM due)),
    NULL, NULL, NULL, NULL, NULL, NULL,
    (SELECT count(*) FROM m), (SELECT count(*) FROM m) - (SELECT count(*) FROM take)`

// leaseIfClaimable is the fold's lease of a stream it offers to the claim
// (EXCLUDED.leased_by set), in its upsert's DO UPDATE: taken only when the
// row it writes is then claimable as the claim's scan judges one: pending
// after the fold, not blocked, due, and no live lease (another bridge's
// fold may have inserted the stream meanwhile, and leased it).
const leaseIfClaimable = `(leased_by, leased_until) = (
                SELECT CASE WHEN ok THEN EXCLUDED.leased_by ELSE s.leased_by END,
                    CASE WHEN ok THEN EXCLUDED.leased_until ELSE s.leased_until END
                FROM (SELECT EXCLUDED.leased_by IS NOT NULL AND NOT s.blocked
                    AND GREATEST(s.head, EXCLUDED.head) > s.watermark
                    AND coalesce(s.next_attempt, CASE WHEN s.head > s.watermark THEN s.pending_since ELSE EXCLUDED.pending_since END) <= now()
                    AND (s.leased_until IS NULL OR s.leased_until <= now()) AS ok) k)`

// foldClaimFetchQuery is foldClaimFetchSQL for schema and events.
func foldClaimFetchQuery(r *strings.Replacer) string {
	return r.Replace(strings.ReplaceAll(foldClaimFetchSQL, "{lease_if_claimable}", leaseIfClaimable))
}
