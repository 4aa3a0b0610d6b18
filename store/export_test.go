package store

import (
	"context"
	"fmt"
	"time"
)

// SetKeepPending sets how long a stream the ack caught up stays pending
// without an append before a claim takes it out (default
// defaultKeepPending); 0 takes it out at the next claim.
func SetKeepPending(s *Store, d time.Duration) {
	s.keepPending = d
	s.q = newQueries(s.schema, s.eventsSQL(), s.External(), d)
}

// DefaultKeepPending is defaultKeepPending, for tests.
const DefaultKeepPending = defaultKeepPending

// TakeOut runs what a claim runs first (queueTakeOut) in a transaction of
// its own, calling between after the take-out statement and before the
// catch-up that follows it; with catchUp false it leaves the catch-up out.
func TakeOut(ctx context.Context, s *Store, between func() error, catchUp bool) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, s.q.takeOut, takeOutScan, s.keepPending.Microseconds()); err != nil {
		return fmt.Errorf("take out: %w", err)
	}
	if err := between(); err != nil {
		return err
	}
	if catchUp {
		if _, err := tx.Exec(ctx, s.q.catchUpTakenOut); err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
	}
	return tx.Commit(ctx)
}
