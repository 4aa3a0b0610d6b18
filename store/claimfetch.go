package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

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
	s.queueFold(b, &left)
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
	events := make([]event.Event, 0, s.fetchRoom(page))
	skipped := false
	seen := map[string]bool{}
	for rows.Next() {
		var (
			stream  *string
			wm      *int64
			retry   *int
			until   *time.Time
			prev    *string
			skip    bool
			id      *int64
			version *int64
			name    *string
			created *time.Time
			e       event.Event
			meta    []byte
		)
		if err := rows.Scan(&stream, &wm, &retry, &until, &prev, &skip, &id, &version, &name, &e.Data, &meta, &created); err != nil {
			return nil, nil, false, err
		}
		if skip {
			skipped = true
			continue
		}
		if !seen[*stream] {
			seen[*stream] = true
			claims = append(claims, event.Claim{Stream: *stream, Watermark: *wm, Retry: *retry, LeasedUntil: *until, PreviousHolder: *prev})
		}
		if id == nil {
			continue // no event past the watermark
		}
		e.ID, e.Stream, e.Version, e.Name, e.Created = *id, *stream, *version, *name, *created
		s.checkEvent(&e, meta)
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
