package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jsbridge/jsbridge/event"
)

// ackManySQL acks many streams in one statement: each row is fenced by the
// live lease exactly as the ack statement is ($1 owner), and moves only
// forward. Its rows are locked with SKIP LOCKED, so the statement never
// waits for a row while holding others: an application transaction
// appending to several streams in its own order holds their rows until it
// commits, and waiting for one of them here could close a deadlock cycle.
// A row skipped that way is left out of RETURNING like one whose lease was
// lost, and AckStreams acks it alone (waiting as a single ack does).
const ackManySQL = `WITH a AS (
    SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS a(stream, version, id)
), locked AS MATERIALIZED (
    SELECT s.stream FROM {schema}.streams s
    WHERE s.stream = ANY($2) AND s.leased_by = $1 AND s.leased_until > now()
    ORDER BY s.stream
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.streams s
SET watermark = GREATEST(s.watermark, a.version),
    watermark_id = CASE WHEN a.version > s.watermark THEN a.id ELSE s.watermark_id END,
    {settle_head_many},
    retry = 0, next_attempt = NULL, error = NULL,
    leased_by = NULL, leased_until = NULL, updated_at = now()
FROM locked JOIN a ON a.stream = locked.stream
WHERE s.stream = locked.stream AND s.leased_by = $1 AND s.leased_until > now()
RETURNING s.stream`

// ackManyQuery is ackManySQL for schema and events: head and
// pending_since as the single ack computes them, with each row's own version for $3.
func ackManyQuery(r *strings.Replacer) string {
	q := strings.ReplaceAll(ackManySQL, "{settle_head_many}", strings.ReplaceAll(settleHead, "$3", "a.version"))
	return r.Replace(q)
}

// AckStreams acks many of owner's streams, each as Ack does (the watermark
// moves to its Progress, never back; retry count, next attempt and error
// are reset; the lease is released; fenced by owner's live lease), in one
// round trip for all of them where it can. It returns one error per ack,
// in the order of acks: nil when the stream was acked, an error wrapping
// event.ErrLeaseLost when owner no longer held it (nothing changed), or
// another error (ErrSettleTimeout, the connection's). One stream's failure
// never keeps another from being acked.
//
// A stream whose row another transaction holds locked at that moment (an
// application appending to it) is not waited for in the shared statement,
// so that statement can never deadlock with a transaction locking several
// streams in its own order; such streams are then acked one by one, each
// as Ack would. Streams must be distinct: a stream named twice gets an
// error wrapping ErrInvalidInput (and the first of its acks is done).
func (s *Store) AckStreams(ctx context.Context, owner string, acks []event.Progress) []error {
	errs := make([]error, len(acks))
	switch len(acks) {
	case 0:
		return errs
	case 1:
		errs[0] = s.Ack(ctx, owner, acks[0].Stream, acks[0].Version, acks[0].ID)
		return errs
	}
	// Sorted by stream: the order the rows are locked in, and a stable
	// statement for the server's plan cache. first[stream] is the index
	// of its first ack; a repeat is refused.
	order := make([]int, 0, len(acks))
	first := make(map[string]int, len(acks))
	for i, a := range acks {
		if j, dup := first[a.Stream]; dup {
			errs[i] = fmt.Errorf("%w: ack stream %q for %s: named twice (acks %d and %d)", ErrInvalidInput, a.Stream, owner, j, i)
			continue
		}
		first[a.Stream] = i
		order = append(order, i)
	}
	slices.SortFunc(order, func(i, j int) int { return strings.Compare(acks[i].Stream, acks[j].Stream) })
	streams := make([]string, len(order))
	versions := make([]int64, len(order))
	ids := make([]int64, len(order))
	for k, i := range order {
		streams[k], versions[k], ids[k] = acks[i].Stream, acks[i].Version, acks[i].ID
	}

	var acked []string
	b := s.settleBatch()
	b.Queue(s.q.ackMany, owner, streams, versions, ids).Query(func(rows pgx.Rows) error {
		var err error
		acked, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	s.queueCatchUp(b, streams)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		if pgCode(err) == sqlStateLockNotAvailable {
			err = fmt.Errorf("%w (%s)", ErrSettleTimeout, s.settleTimeout)
		}
		for _, i := range order {
			errs[i] = fmt.Errorf("ack stream %q for %s (with %d others): %w", acks[i].Stream, owner, len(order)-1, err)
		}
		return errs
	}
	done := make(map[string]bool, len(acked))
	for _, st := range acked {
		done[st] = true
	}
	// Left out: the lease was lost, or an appender held the row. The
	// single ack waits for the row and tells which.
	for _, i := range order {
		if !done[acks[i].Stream] {
			errs[i] = s.Ack(ctx, owner, acks[i].Stream, acks[i].Version, acks[i].ID)
		}
	}
	return errs
}
