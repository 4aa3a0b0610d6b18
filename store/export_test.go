package store

import "context"

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
