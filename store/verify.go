package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jsbridge/jsbridge/event"
)

// StreamEvents returns up to limit events of stream with after < version
// <= through, in version order, read exactly as Fetch reads them (so an
// audit compares what the drain published: jsonb data as Postgres prints
// it, an unreadable row with Err set). A non-zero since keeps only events
// created at or after it. Page through a stream by passing the last
// version returned as the next after. It takes no lease and changes
// nothing. Errors: ErrInvalidInput (wrapped) for limit <= 0.
func (s *Store) StreamEvents(ctx context.Context, stream string, after, through int64, since time.Time, limit int) ([]event.Event, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: stream events limit %d (want > 0)", ErrInvalidInput, limit)
	}
	var sinceArg any
	if !since.IsZero() {
		sinceArg = since
	}
	rows, err := s.pool.Query(ctx, s.q.streamEvents, stream, after, through, sinceArg, limit)
	if err != nil {
		return nil, fmt.Errorf("read events of stream %q from %s: %w", stream, s.EventsTable(), err)
	}
	events, err := pgx.CollectRows(rows, s.scanEvent)
	if err != nil {
		return nil, fmt.Errorf("read events of stream %q from %s: %w", stream, s.EventsTable(), err)
	}
	return events, nil
}
