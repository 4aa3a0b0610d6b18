package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// StreamFilter selects streams for Streams. The zero value selects every
// stream.
type StreamFilter struct {
	// Blocked keeps only blocked streams.
	Blocked bool
	// Lagging keeps only streams with events past their watermark.
	Lagging bool
	// Match keeps only streams whose name matches this POSIX regular
	// expression (Postgres ~); empty matches all.
	Match string
	// Limit caps the number of streams returned; 0 means no cap.
	Limit int
}

// StreamInfo is the bridge's state of one stream, as operators see it.
type StreamInfo struct {
	// Stream is the stream's name.
	Stream string
	// Watermark is the version of the last forwarded event (-1: none).
	Watermark int64
	// Head is the version of the last committed event.
	Head int64
	// Lag is how many events are not forwarded yet (Head - Watermark).
	Lag int64
	// LagAge is the age of the oldest event not forwarded yet (database
	// clock); 0 when Lag is 0.
	LagAge time.Duration
	// Retry counts the failed attempts since the last ack.
	Retry int
	// NextAttempt is when the stream may be claimed again after a failure;
	// zero when not backing off.
	NextAttempt time.Time
	// Blocked is true when the stream is blocked until unblocked or reset.
	Blocked bool
	// Error is the last failure's reason ("" when none).
	Error string
	// LeasedBy is the owner of the lease ("" when none was taken or it was
	// released).
	LeasedBy string
	// LeasedUntil is when the lease expires; zero when there is none.
	LeasedUntil time.Time
}

// Streams lists the streams the filter selects, ordered by name, without
// taking any lease. Errors: ErrInvalidInput (wrapped) for a negative Limit or
// a Match that is not a valid regular expression.
func (s *Store) Streams(ctx context.Context, f StreamFilter) ([]StreamInfo, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("%w: stream filter Limit %d (want >= 0)", ErrInvalidInput, f.Limit)
	}
	rows, err := s.pool.Query(ctx, s.q.streams, f.Blocked, f.Lagging, f.Match, f.Limit)
	if err != nil {
		return nil, streamsError(f, err)
	}
	infos, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamInfo, error) {
		var si StreamInfo
		var lagAgeMicros int64
		var next, until pgtype.Timestamptz
		err := r.Scan(&si.Stream, &si.Watermark, &si.Head, &si.Lag, &lagAgeMicros,
			&si.Retry, &next, &si.Blocked, &si.Error, &si.LeasedBy, &until)
		si.LagAge = time.Duration(lagAgeMicros) * time.Microsecond
		if next.Valid {
			si.NextAttempt = next.Time
		}
		if until.Valid {
			si.LeasedUntil = until.Time
		}
		return si, err
	})
	if err != nil {
		return nil, streamsError(f, err)
	}
	return infos, nil
}

func streamsError(f StreamFilter, err error) error {
	if code := pgCode(err); code == "2201B" { // invalid_regular_expression
		return fmt.Errorf("%w: stream filter Match %q is not a valid regular expression: %v", ErrInvalidInput, f.Match, err)
	}
	return fmt.Errorf("list streams: %w", err)
}

// Unblock clears the blocked flag, error, retry count and next attempt of
// the named streams, so they are claimed again from their watermark. It
// returns the names of the streams it changed (blocked or backing off);
// unknown and healthy streams are skipped.
func (s *Store) Unblock(ctx context.Context, streams []string) ([]string, error) {
	return s.changeStreams(ctx, "unblock", s.q.unblock, streams)
}

// Reset moves the named streams' watermarks back to -1 and unblocks them, so
// every event is forwarded again from version 0 (a re-publish: JetStream
// drops only those still inside its duplicate window). Any lease on them is
// dropped, so a drainer still holding one cannot move the watermark past the
// reset. It returns the names of the streams that exist and were reset.
func (s *Store) Reset(ctx context.Context, streams []string) ([]string, error) {
	return s.changeStreams(ctx, "reset", s.q.reset, streams)
}

func (s *Store) changeStreams(ctx context.Context, op, query string, streams []string) ([]string, error) {
	if len(streams) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, query, streams)
	if err != nil {
		return nil, fmt.Errorf("%s %d streams: %w", op, len(streams), err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("%s %d streams: %w", op, len(streams), err)
	}
	return changed, nil
}

// Totals returns the number of events appended (sum of head+1) and forwarded
// (sum of watermark+1) over all streams; their difference is the total lag.
func (s *Store) Totals(ctx context.Context) (appended, forwarded int64, err error) {
	if err := s.pool.QueryRow(ctx, s.q.totals).Scan(&appended, &forwarded); err != nil {
		return 0, 0, fmt.Errorf("stream totals: %w", err)
	}
	return appended, forwarded, nil
}
