package store

import "context"

// Fold takes the markers appends wrote while no drainer waited (migration
// 009) into the streams table, for tests that read that table directly.
func Fold(ctx context.Context, s *Store) error { return s.fold(ctx) }
