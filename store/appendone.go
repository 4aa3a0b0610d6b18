package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jsbridge/jsbridge/event"
)

// appendOneSQL is Append in one statement, run as its own transaction: it
// reads the head, checks the expected version ($2; $6 is AnyVersion) and
// inserts the events after the head, so an append is one round trip and
// one commit instead of six (begin, read the head, savepoint, insert,
// release, commit). An event's created time is its transaction's start,
// so the round trips before the commit were part of the event's age when
// the bridge saw it. The first column is the head read; when the check
// failed no event is inserted and the one row has NULLs after it.
const appendOneSQL = `WITH h AS (
    SELECT coalesce(max(version), -1) AS head FROM {events} WHERE stream = $1
), ins AS (
    INSERT INTO {events} (stream, version, name, data, meta)
    SELECT $1, h.head + t.ord, t.name, t.data::jsonb, t.meta::jsonb
    FROM h, unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS t(name, data, meta, ord)
    WHERE $2::bigint = $6::bigint OR $2::bigint = h.head
    ORDER BY t.ord
    RETURNING id, version, name, data, meta, created
)
SELECT h.head, i.id, i.version, i.name, i.data, i.meta, i.created
FROM h LEFT JOIN ins i ON true
ORDER BY i.version`

// appendOne is Append's body (see appendOneSQL); the arguments are valid.
func (s *Store) appendOne(ctx context.Context, stream string, expected int64, events []NewEvent) ([]event.Event, error) {
	names, datas, metas, err := columns(stream, events)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q.appendOne, stream, expected, names, datas, metas, AnyVersion)
	if err != nil {
		return nil, fmt.Errorf("append to stream %q: %w", stream, err)
	}
	head := int64(-1)
	out := make([]event.Event, 0, len(events))
	for rows.Next() {
		var (
			id, version *int64
			name        *string
			data, meta  []byte
			created     *time.Time
		)
		if err := rows.Scan(&head, &id, &version, &name, &data, &meta, &created); err != nil {
			rows.Close()
			return nil, fmt.Errorf("append to stream %q: scan: %w", stream, err)
		}
		if id == nil {
			continue // the check failed: nothing inserted
		}
		e := event.Event{ID: *id, Stream: stream, Version: *version, Name: *name, Data: data, Created: *created}
		var err error
		if e.Meta, err = event.ParseMeta(meta); err != nil {
			rows.Close()
			return nil, fmt.Errorf("append to stream %q: decode meta: %w", stream, err)
		}
		out = append(out, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		if pgCode(err) == sqlStateUniqueViolation {
			// A concurrent append took these versions first; report the
			// head it left.
			actual := head + 1
			_ = s.pool.QueryRow(ctx, s.q.head, stream).Scan(&actual)
			return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: actual}
		}
		return nil, fmt.Errorf("append to stream %q: %w", stream, err)
	}
	if len(out) == 0 {
		return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: head}
	}
	return out, nil
}
