package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Fold takes the markers appends wrote while no drainer waited (migration
// 009) into the streams table, for tests that read that table directly.
func Fold(ctx context.Context, s *Store) error { return s.fold(ctx) }

// SetMarkerVacuumEvery sets how many folded markers s lets pass between
// two vacuums of the marker table (markerVacuumEvery by default).
func SetMarkerVacuumEvery(s *Store, n int64) { s.markers.every = n }

// SetMarkerVacuumSQL replaces the statement of s's vacuum of the marker
// table (a test makes it one that waits).
func SetMarkerVacuumSQL(s *Store, sql string) { s.markers.sql = sql }

// MarkerVacuumRunning reports whether s's vacuum of the marker table runs.
func MarkerVacuumRunning(s *Store) bool {
	s.markers.mu.Lock()
	defer s.markers.mu.Unlock()
	return s.markers.done != nil
}

// FoldIn runs one fold of at most limit markers in tx, as a claim's fold
// (leaving streams under a live lease) or a reader's (skipLeased false),
// and returns the markers it read and those it left.
func FoldIn(ctx context.Context, tx pgx.Tx, s *Store, limit int, skipLeased bool) (read, kept int64, err error) {
	err = tx.QueryRow(ctx, s.q.fold, limit, nil, skipLeased).Scan(&read, &kept)
	return read, kept, err
}
