package store

import "context"

// Fold takes the markers appends wrote while no drainer waited (migration
// 009) into the streams table, for tests that read that table directly.
func Fold(ctx context.Context, s *Store) error { return s.fold(ctx) }

// SetMarkerVacuumEvery sets how many folded markers s lets pass between
// two vacuums of the marker table (markerVacuumEvery by default).
func SetMarkerVacuumEvery(s *Store, n int64) { s.markers.every = n }
