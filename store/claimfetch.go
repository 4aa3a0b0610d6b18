package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jsbridge/jsbridge/event"
)

// ClaimFetch is Claim and then Fetch of the claimed streams, in one
// statement (after Claim's fold), one round trip and one transaction (it implements
// drain.ClaimFetcher): a drain cycle's claim and fetch cost one commit
// instead of two. The claims are Claim's; events holds up to perStream
// events of each claimed stream past its watermark, in version order,
// grouped by stream, read as Fetch reads them (an unreadable row comes
// back with Err set) from the claim's snapshot. Errors: ErrInvalidInput
// (wrapped) for Claim's bad arguments or perStream <= 0; the statement's
// error otherwise (nothing claimed, as far as the caller knows: a claim
// cancelled on the client may still have committed, as with Claim).
func (s *Store) ClaimFetch(ctx context.Context, owner string, limit int, lease time.Duration, perStream int) ([]event.Claim, []event.Event, error) {
	if err := checkClaimFetch(owner, limit, lease, perStream); err != nil {
		return nil, nil, err
	}
	var (
		claims        []event.Claim
		events        []event.Event
		skipped, left bool
	)
	b := &pgx.Batch{}
	s.queueFold(b, nil, &left)
	b.Queue(s.q.claimFetch, owner, limit, lease.Microseconds(), perStream).Query(func(rows pgx.Rows) error {
		var err error
		claims, events, skipped, err = s.scanClaimEvents(rows, limit*perStream)
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("claim and fetch streams for %s: %w", owner, err)
	}
	s.notes.skipped(skipped || left)
	return claims, events, nil
}

// checkClaimFetch checks ClaimFetch's arguments.
func checkClaimFetch(owner string, limit int, lease time.Duration, perStream int) error {
	if err := checkClaim(owner, limit, lease); err != nil {
		return err
	}
	if perStream <= 0 {
		return fmt.Errorf("%w: fetch perStream %d (want > 0)", ErrInvalidInput, perStream)
	}
	return nil
}

// scanClaimEvents reads the rows of the claimFetch statement: the streams
// claimed (one per stream, in the order their rows come), their events
// (grouped by stream, in version order), and whether the claim passed
// over a due stream whose row another transaction held. page is the most
// events the statement can return. It closes rows.
func (s *Store) scanClaimEvents(rows pgx.Rows, page int) ([]event.Claim, []event.Event, bool, error) {
	defer rows.Close()
	var claims []event.Claim
	var events []event.Event // made at the first event: a claim often returns none
	skipped := false
	seen := map[string]bool{}
	// Value targets, not pointers: pgx fills a **T by reflection and a
	// new T per value, which was most of the bridge's allocations per
	// event at 1,000 events/s. stream and meta are read in place (valid
	// until the next row): the stream's name is copied once per claim,
	// and meta is parsed into strings.
	var (
		stream        pgtype.DriverBytes
		wm, retry     pgtype.Int8
		until         pgtype.Timestamptz
		prev          pgtype.Text
		skip          bool
		id, version   pgtype.Int8
		name          pgtype.Text
		created       anyTime
		meta          pgtype.DriverBytes
		data          []byte
		currentStream string
	)
	for rows.Next() {
		data = nil
		if err := rows.Scan(&stream, &wm, &retry, &until, &prev, &skip, &id, &version, &name, &data, &meta, &created); err != nil {
			return nil, nil, false, err
		}
		if skip {
			skipped = true
			continue
		}
		if len(claims) == 0 || string(stream) != currentStream {
			currentStream = string(stream)
		}
		if !seen[currentStream] {
			seen[currentStream] = true
			claims = append(claims, event.Claim{Stream: currentStream, Watermark: wm.Int64, Retry: int(retry.Int64), LeasedUntil: until.Time, PreviousHolder: prev.String})
		}
		if !id.Valid {
			continue // no event past the watermark
		}
		e := event.Event{ID: id.Int64, Stream: currentStream, Version: version.Int64, Name: name.String, Data: data, Created: created.t}
		s.checkEvent(&e, meta)
		if events == nil {
			events = make([]event.Event, 0, s.fetchRoom(page))
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, false, err
	}
	// The statement orders them so; a plan that did not is caught here.
	byStreamVersion := func(a, b event.Event) int {
		return cmp.Or(cmp.Compare(a.Stream, b.Stream), cmp.Compare(a.Version, b.Version))
	}
	if !slices.IsSortedFunc(events, byStreamVersion) {
		slices.SortFunc(events, byStreamVersion)
	}
	s.lastFetch.Store(int64(len(events)))
	return claims, events, skipped, nil
}

// anyTime scans a timestamptz or a timestamp (an external events table's
// created may be either) without a pointer per row: NULL leaves the zero
// time, an infinite one is refused as pgx refuses it for a time.Time.
type anyTime struct{ t time.Time }

// ScanTimestamptz implements pgtype.TimestamptzScanner.
func (a *anyTime) ScanTimestamptz(v pgtype.Timestamptz) error {
	if v.Valid && v.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("cannot scan an infinite timestamptz into a time")
	}
	a.t = v.Time
	return nil
}

// ScanTimestamp implements pgtype.TimestampScanner.
func (a *anyTime) ScanTimestamp(v pgtype.Timestamp) error {
	if v.Valid && v.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("cannot scan an infinite timestamp into a time")
	}
	a.t = v.Time
	return nil
}
