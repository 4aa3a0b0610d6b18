package store

import (
	"context"
	"fmt"
	"sort"
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
	// Names keeps only the streams named here; empty means any name.
	Names []string
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
	var names []string
	if len(f.Names) > 0 {
		names = f.Names
	}
	if err := s.fold(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q.streams, f.Blocked, f.Lagging, f.Match, f.Limit, names)
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

// Changed is one stream an operator command changed, as it was before.
type Changed struct {
	// Stream is the stream's name.
	Stream string
	// Watermark is the watermark before the change (Unblock leaves it:
	// the stream resumes after it; Reset moves it to -1).
	Watermark int64
	// Head is the version of the stream's last committed event.
	Head int64
	// Blocked and Error are the stream's blocked flag and last error before
	// the change.
	Blocked bool
	Error   string
}

// Unblock clears the blocked flag, error, retry count and next attempt of
// the named streams, so they are claimed again from their watermark. It
// returns, in name order, the streams it changed (blocked or backing off) as
// they were; unknown and healthy streams are skipped. When it changed any,
// it notifies the store's channel, so running bridges claim them at once.
func (s *Store) Unblock(ctx context.Context, streams []string) ([]Changed, error) {
	if len(streams) == 0 {
		return nil, nil
	}
	return s.changeStreams(ctx, "unblock", s.q.unblock, streams)
}

// UnblockMatch is Unblock for every blocked or backing-off stream whose
// name matches the POSIX regular expression pattern (Postgres ~); an empty
// pattern selects them all. Errors: ErrInvalidInput (wrapped) for a pattern
// that is not a valid regular expression.
func (s *Store) UnblockMatch(ctx context.Context, pattern string) ([]Changed, error) {
	out, err := s.changeStreams(ctx, "unblock", s.q.unblockMatch, pattern)
	if code := pgCode(err); code == "2201B" { // invalid_regular_expression
		return nil, fmt.Errorf("%w: unblock pattern %q is not a valid regular expression: %v", ErrInvalidInput, pattern, err)
	}
	return out, err
}

// Reset moves the named streams' watermarks back to -1 and unblocks them, so
// every event is forwarded again from version 0 (a re-publish: JetStream
// drops only those still inside its duplicate window). Any lease on them is
// dropped, so a drainer still holding one cannot move the watermark past the
// reset. It returns, in name order, the streams that exist, as they were
// before the reset. When there were any, it notifies the store's channel,
// so running bridges claim them at once.
func (s *Store) Reset(ctx context.Context, streams []string) ([]Changed, error) {
	if len(streams) == 0 {
		return nil, nil
	}
	return s.changeStreams(ctx, "reset", s.q.reset, streams)
}

func (s *Store) changeStreams(ctx context.Context, op, query string, arg any) ([]Changed, error) {
	if err := s.fold(ctx); err != nil {
		return nil, fmt.Errorf("%s streams: %w", op, err)
	}
	rows, err := s.pool.Query(ctx, query, arg)
	if err != nil {
		return nil, fmt.Errorf("%s streams: %w", op, err)
	}
	changed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Changed, error) {
		var c Changed
		err := r.Scan(&c.Stream, &c.Watermark, &c.Head, &c.Blocked, &c.Error)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s streams: %w", op, err)
	}
	if len(changed) > 0 {
		// The streams may be claimable now with no append to notify (an
		// append to a pending stream sends none): wake the drainers. The
		// change is done; a failure here only leaves them to their poll.
		if _, err := s.pool.Exec(ctx, s.q.wake); err != nil {
			s.log.Warn("notify the bridges after "+op, "streams", len(changed), "error", err)
		}
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].Stream < changed[j].Stream })
	return changed, nil
}

// Backlog is the drain's state over all streams, computed in Postgres, so
// every bridge replica reports the same figures.
type Backlog struct {
	// Blocked is the number of blocked streams.
	Blocked int64
	// Lagging is the number of streams that are not blocked and have events
	// past their watermark.
	Lagging int64
	// OldestAge is the age (database clock) of the oldest event not yet
	// forwarded, blocked streams included; 0 when every event is forwarded.
	OldestAge time.Duration
}

// Backlog counts blocked and lagging streams and finds the oldest event not
// forwarded yet. Its cost grows with the blocked and lagging streams (two
// partial indexes), not with idle ones.
func (s *Store) Backlog(ctx context.Context) (Backlog, error) {
	var b Backlog
	var micros int64
	if err := s.fold(ctx); err != nil {
		return b, fmt.Errorf("stream backlog: %w", err)
	}
	if err := s.pool.QueryRow(ctx, s.q.backlog).Scan(&b.Blocked, &b.Lagging, &micros); err != nil {
		return b, fmt.Errorf("stream backlog: %w", err)
	}
	b.OldestAge = time.Duration(micros) * time.Microsecond
	return b, nil
}

// Totals returns the number of events appended (sum of head+1) and forwarded
// (sum of watermark+1) over all streams; their difference is the total lag.
func (s *Store) Totals(ctx context.Context) (appended, forwarded int64, err error) {
	if err := s.fold(ctx); err != nil {
		return 0, 0, fmt.Errorf("stream totals: %w", err)
	}
	if err := s.pool.QueryRow(ctx, s.q.totals).Scan(&appended, &forwarded); err != nil {
		return 0, 0, fmt.Errorf("stream totals: %w", err)
	}
	return appended, forwarded, nil
}
