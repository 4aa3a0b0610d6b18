// Package mark names the keys the migration (package migrate) leaves in
// the positions bucket beside the records and cursor keys, and the owner
// it writes in the records: the shared engine's start reads DoneKey (an
// old layout without it is not moved: consumer.ErrNotMigrated), and the
// cleanup (package cleanup) reads DoneKey and Owner to know that the
// migration was applied and that the shared engine ran on it since.
package mark

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// PartitionsKey holds P in base 10, written once (the new engine's
	// replicas refuse to start with another).
	PartitionsKey = "partitions"
	// LockKey holds the fingerprint of the plan being applied while a
	// migration runs: a second migration of another plan is refused
	// meanwhile, one of the same plan (a run that stopped midway) goes on.
	LockKey = "migrate.lock"
	// DoneKey holds the fingerprint of the plan applied: a second run of
	// the same plan finds it done and writes nothing.
	DoneKey = "migrated"
	// Owner is the owner the migration writes in the partition records
	// (epoch 0): the new engine's first claim of each takes it over.
	Owner = "migrate"
)

// Read returns key's value in kv, "" when it has none. Errors: the
// server's.
func Read(ctx context.Context, kv jetstream.KeyValue, key string) (string, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("migrate: read %q of bucket %q: %w", key, kv.Bucket(), err)
	}
	return string(e.Value()), nil
}
