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
// statement (with Claim's fold: store/foldclaim.go), one round trip and one transaction (it implements
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
		claims  []event.Claim
		events  []event.Event
		skipped bool
	)
	b := &pgx.Batch{}
	s.queueClaimFetch(b, owner, limit, lease, perStream, &claims, &events, &skipped)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("claim and fetch streams for %s: %w", owner, err)
	}
	s.notes.skipped(skipped)
	return claims, events, nil
}

// queueClaimFetch queues in b the claim of up to limit streams for owner
// with the fetch of up to perStream events of each, after the fold of the
// markers with the bridge's own events table (one statement either way:
// foldClaimFetch, or claimFetch for an external table). When the batch
// has run, *claims and *events hold what scanClaimEvents read, and
// *skipped is set when the claim passed over a held row or the fold left
// markers (more than foldLimit, or rows other transactions held), so
// that the caller has the drain look again soon (Store.notes).
func (s *Store) queueClaimFetch(b *pgx.Batch, owner string, limit int, lease time.Duration, perStream int, claims *[]event.Claim, events *[]event.Event, skipped *bool) {
	q, args := s.q.claimFetch, []any{owner, limit, lease.Microseconds(), perStream}
	if !s.External() {
		q, args = s.q.foldClaimFetch, append(args, foldLimit)
	}
	b.Queue(q, args...).Query(func(rows pgx.Rows) error {
		var (
			err        error
			read, kept int64
		)
		*claims, *events, *skipped, read, kept, err = s.scanClaimEvents(rows, limit*perStream)
		if err != nil {
			return err
		}
		*skipped = *skipped || kept > 0 || read == foldLimit
		s.folded(read - kept)
		return nil
	})
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

// scanClaimEvents reads the rows of the claimFetch and foldClaimFetch
// statements: the streams claimed (one per stream, in the order their
// rows come), their events (grouped by stream, in version order), and,
// from the last row, whether the claim passed over a due stream whose row
// another transaction held and the markers the fold read and left. page
// is the most events the statement can return. It closes rows.
func (s *Store) scanClaimEvents(rows pgx.Rows, page int) (claims []event.Claim, events []event.Event, skipped bool, read, kept int64, err error) {
	defer rows.Close()
	// events is made at the first event: a claim often returns none.
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
		folded, left  pgtype.Int8
		currentStream string
	)
	for rows.Next() {
		data = nil
		if err := rows.Scan(&stream, &wm, &retry, &until, &prev, &skip, &id, &version, &name, &data, &meta, &created, &folded, &left); err != nil {
			return nil, nil, false, 0, 0, err
		}
		if folded.Valid {
			// The last row: no claim.
			skipped, read, kept = skip, folded.Int64, left.Int64
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
		return nil, nil, false, 0, 0, err
	}
	// The statement orders them so; a plan that did not is caught here.
	byStreamVersion := func(a, b event.Event) int {
		return cmp.Or(cmp.Compare(a.Stream, b.Stream), cmp.Compare(a.Version, b.Version))
	}
	if !slices.IsSortedFunc(events, byStreamVersion) {
		slices.SortFunc(events, byStreamVersion)
	}
	s.lastFetch.Store(int64(len(events)))
	return claims, events, skipped, read, kept, nil
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
