package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jsbridge/jsbridge/event"
)

// Expected versions for Append and AppendTx besides a stream's actual head
// version (0-based: a stream with one event has head version 0).
const (
	// AnyVersion skips the optimistic concurrency check.
	AnyVersion int64 = -2
	// NoStream requires the stream to have no events yet.
	NoStream int64 = -1
)

// sqlStateUniqueViolation is Postgres' unique_violation.
const sqlStateUniqueViolation = "23505"

// NewEvent is an event to append.
type NewEvent struct {
	// Name is the event type, e.g. "OrderPlaced" (required).
	Name string
	// Data is the payload: valid JSON (required). Postgres stores it as jsonb,
	// so the stored bytes are its normalized form.
	Data []byte
	// Meta carries the correlation and causation ids and the trace context
	// (traceparent, tracestate) the bridge continues (optional).
	Meta event.Meta
}

// ConcurrencyError is returned when an append's expected version is not the
// stream's head version: either the check failed, or another transaction
// appended the same versions first and the insert hit the unique index
// (SQLSTATE 23505). Callers reload the stream and retry; test with errors.As.
type ConcurrencyError struct {
	// Stream is the stream appended to.
	Stream string
	// Expected is the version the caller expected (AnyVersion, NoStream or a
	// head version).
	Expected int64
	// Actual is the stream's head version as last read (-1 for an empty
	// stream).
	Actual int64
}

// Error says which stream and which versions.
func (e *ConcurrencyError) Error() string {
	return fmt.Sprintf("concurrency conflict on stream %q: expected version %d, actual %d", e.Stream, e.Expected, e.Actual)
}

// Append appends events to stream in its own transaction, after checking
// that the stream's head version is expectedVersion (AnyVersion: no check,
// NoStream: empty stream). The events get versions head+1, head+2, ... and
// increasing ids. It returns the stored events (id, version, created and data
// as stored). Errors: *ConcurrencyError on a version conflict (including a
// concurrent append that won the race); ErrInvalidInput (wrapped) for an
// empty stream name, no events, an empty event name or data that is not JSON.
func (s *Store) Append(ctx context.Context, stream string, expectedVersion int64, events ...NewEvent) ([]event.Event, error) {
	if err := validateAppend(stream, expectedVersion, events); err != nil {
		return nil, err
	}
	return s.appendOne(ctx, stream, expectedVersion, events)
}

// AppendTx is Append inside the caller's transaction tx: the events (and the
// stream's head, which wakes the bridge) become visible when the caller
// commits. The insert runs under a savepoint, so after a *ConcurrencyError tx
// is still usable. Errors as for Append.
func (s *Store) AppendTx(ctx context.Context, tx pgx.Tx, stream string, expectedVersion int64, events ...NewEvent) ([]event.Event, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx is nil", ErrInvalidInput)
	}
	if err := validateAppend(stream, expectedVersion, events); err != nil {
		return nil, err
	}
	return s.appendTx(ctx, tx, stream, expectedVersion, events)
}

func validateAppend(stream string, expectedVersion int64, events []NewEvent) error {
	if stream == "" {
		return fmt.Errorf("%w: stream is empty", ErrInvalidInput)
	}
	if expectedVersion < AnyVersion {
		return fmt.Errorf("%w: expectedVersion %d for stream %q (want AnyVersion -2, NoStream -1 or a version >= 0)", ErrInvalidInput, expectedVersion, stream)
	}
	if len(events) == 0 {
		return fmt.Errorf("%w: no events to append to stream %q", ErrInvalidInput, stream)
	}
	for i, e := range events {
		if e.Name == "" {
			return fmt.Errorf("%w: events[%d].Name of stream %q is empty", ErrInvalidInput, i, stream)
		}
		if !json.Valid(e.Data) {
			return fmt.Errorf("%w: events[%d].Data of stream %q (%s) is not valid JSON: %q", ErrInvalidInput, i, stream, e.Name, truncate(e.Data, 64))
		}
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// columns returns events' names, data and meta (JSON) as the arrays the
// append statements unnest.
func columns(stream string, events []NewEvent) (names, datas, metas []string, err error) {
	names = make([]string, len(events))
	datas = make([]string, len(events))
	metas = make([]string, len(events))
	for i, e := range events {
		meta, err := json.Marshal(e.Meta)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("append to stream %q: encode events[%d].Meta: %w", stream, i, err)
		}
		names[i], datas[i], metas[i] = e.Name, string(e.Data), string(meta)
	}
	return names, datas, metas, nil
}

func (s *Store) appendTx(ctx context.Context, tx pgx.Tx, stream string, expected int64, events []NewEvent) ([]event.Event, error) {
	var head int64
	if err := tx.QueryRow(ctx, s.q.head, stream).Scan(&head); err != nil {
		return nil, fmt.Errorf("append to stream %q: read head: %w", stream, err)
	}
	if expected != AnyVersion && expected != head {
		return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: head}
	}

	names, datas, metas, err := columns(stream, events)
	if err != nil {
		return nil, err
	}

	// A savepoint keeps the caller's transaction usable after a lost race.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("append to stream %q: savepoint: %w", stream, err)
	}
	rows, err := sp.Query(ctx, s.q.insertEvents, stream, head, names, datas, metas)
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, fmt.Errorf("append to stream %q: %w", stream, err)
	}
	out := make([]event.Event, 0, len(events))
	for rows.Next() {
		e := event.Event{Stream: stream}
		var meta []byte
		if err := rows.Scan(&e.ID, &e.Version, &e.Name, &e.Data, &meta, &e.Created); err != nil {
			rows.Close()
			_ = sp.Rollback(ctx)
			return nil, fmt.Errorf("append to stream %q: scan: %w", stream, err)
		}
		if e.Meta, err = event.ParseMeta(meta); err != nil {
			rows.Close()
			_ = sp.Rollback(ctx)
			return nil, fmt.Errorf("append to stream %q: decode meta: %w", stream, err)
		}
		out = append(out, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		_ = sp.Rollback(ctx)
		if pgCode(err) == sqlStateUniqueViolation {
			// Another transaction appended these versions first; report the
			// head it left, read after rolling back to the savepoint.
			actual := head + 1
			_ = tx.QueryRow(ctx, s.q.head, stream).Scan(&actual)
			return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: actual}
		}
		return nil, fmt.Errorf("append to stream %q: %w", stream, err)
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("append to stream %q: release savepoint: %w", stream, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// pgCode returns the SQLSTATE of a Postgres error in err's chain, or "".
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
