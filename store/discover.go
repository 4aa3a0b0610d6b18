package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxPendingScans bounds the scans kept waiting for their writers; dropping
// the oldest only delays how far the scan position advances.
const maxPendingScans = 64

// ErrNotExternal is returned by Discover on a store that drains its own
// events table, whose trigger keeps the heads current.
var ErrNotExternal = errors.New("store drains its own events table: nothing to discover")

// DiscoverStats says what one Discover call did.
type DiscoverStats struct {
	// Rows is the number of event rows read (rows re-read while their
	// neighbours' transactions may still commit count again).
	Rows int64
	// Streams is the number of streams whose head moved.
	Streams int64
	// Low is the scan position after the call: every committed event with an
	// id at or below it has been seen and never needs reading again.
	Low int64
	// Seen is the highest id read so far.
	Seen int64
}

// Discover finds, in an external events table (WithEventsTable), the events
// committed since the last call and moves their streams' heads in the
// bridge's streams table, so Claim sees them. Several bridges may call it at
// once: one discovers, the others return at once (a transaction-scoped
// advisory lock).
//
// It is exact without a trigger or a column of ours: ids are drawn from a
// sequence when a row is inserted but become visible at commit, so a
// transaction may commit a lower id after a higher one was read, or roll it
// back and leave a gap. Each call scans the ids past the scan position Low,
// upserting head = GREATEST(head, max(version)) per stream (idempotent, so a
// re-read row is harmless), and records, with the highest id it read, the
// transactions then holding a write lock on the table or its sequence: any
// row with a lower id that the scan could not see belongs to one of them
// (its writer locked the table, or drew from the sequence, before the id was
// drawn, and holds the lock until it ends). Once every one of them has ended,
// the next scan sees all such rows that committed, and Low moves up to that
// id. A call's cost is the rows appended since about the previous call, not
// the size of the table; a long-running writing transaction holds Low back
// and widens the re-read until it ends. Catching up on a large table reads
// at most 10,000 ids per transaction.
//
// Assumptions (true of identity and serial columns): ids come from a
// sequence with CACHE 1 drawn while the row is inserted, or from nextval in
// the inserting transaction. Errors: ErrNotExternal on the bridge's own
// events table; Postgres errors, wrapped.
func (s *Store) Discover(ctx context.Context) (DiscoverStats, error) {
	var total DiscoverStats
	if !s.External() {
		return total, ErrNotExternal
	}
	for {
		st, more, err := s.discoverOnce(ctx)
		total.Rows += st.Rows
		total.Streams += st.Streams
		total.Low, total.Seen = st.Low, st.Seen
		if err != nil || !more {
			return total, err
		}
	}
}

// discoverOnce is one step of Discover in one transaction; more is true
// when ids past the step's upper bound are still to be read.
func (s *Store) discoverOnce(ctx context.Context) (st DiscoverStats, more bool, err error) {
	table := s.eventsTable
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, s.q.tryLock, "jsbridge.discover."+s.schema+"."+table).Scan(&locked); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if !locked {
			return nil // another bridge is discovering right now
		}
		if _, err := tx.Exec(ctx, s.q.discoveryInit, table); err != nil {
			return fmt.Errorf("init position: %w", err)
		}
		var low, seen int64
		if err := tx.QueryRow(ctx, s.q.discoveryState, table).Scan(&low, &seen); err != nil {
			return fmt.Errorf("read position: %w", err)
		}
		// Pending scans whose writers have all ended: every row at or below
		// their id that will ever commit has committed, so the scan below,
		// which starts after this check, sees it.
		var settled []int64
		target := low
		if err := tx.QueryRow(ctx, s.q.discoverySettled, table).Scan(&settled, &target); err != nil {
			return fmt.Errorf("check pending scans: %w", err)
		}
		target = max(target, low)

		var top int64
		if err := tx.QueryRow(ctx, s.q.discoveryTop).Scan(&top); err != nil {
			return fmt.Errorf("read highest id: %w", err)
		}
		upper := max(min(top, seen+s.discoverySpan), seen)
		more = upper < top
		if upper > low {
			if err := tx.QueryRow(ctx, s.q.discoveryScan, low, upper).Scan(&st.Rows, &st.Streams); err != nil {
				return fmt.Errorf("scan ids %d..%d: %w", low+1, upper, err)
			}
		}
		newLow := target
		if upper > newLow {
			// Read after the scan: every writer that may still commit an id
			// at or below upper (drawn before top was read) is in this set.
			if _, err := tx.Exec(ctx, s.q.discoveryAddPending, table, upper, s.eventsIdent.Sanitize()); err != nil {
				return fmt.Errorf("record pending scan: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, s.q.discoveryTrim, table, newLow, maxPendingScans); err != nil {
			return fmt.Errorf("trim pending scans: %w", err)
		}
		if _, err := tx.Exec(ctx, s.q.discoverySave, table, newLow, upper); err != nil {
			return fmt.Errorf("save position: %w", err)
		}
		st.Low, st.Seen = newLow, upper
		return nil
	})
	if err != nil {
		return st, false, fmt.Errorf("discover events in %s: %w", table, err)
	}
	return st, more, nil
}

// discoverLoop polls an external events table every discovery interval and
// sends on ch when a head moved, until ctx is done.
func (s *Store) discoverLoop(ctx context.Context, ch chan<- struct{}) {
	defer close(ch)
	t := time.NewTicker(s.discoveryInterval)
	defer t.Stop()
	failing := false
	for {
		st, err := s.Discover(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				s.log.Warn("discovery failed; retrying every interval", "events_table", s.eventsTable, "error", err)
			}
			failing = true
		case err == nil:
			if failing {
				s.log.Info("discovery recovered", "events_table", s.eventsTable)
			}
			failing = false
			if st.Streams > 0 {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
