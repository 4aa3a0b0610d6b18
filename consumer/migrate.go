package consumer

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/migrate"
	"github.com/jsbridge/jsbridge/internal/migrate/cleanup"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
)

// The move from the per-subscription durables to the shared engine's
// positions bucket (docs/operations.md, "Upgrading from a release that ran the durables engine";
// docs/design/next-engine.md, section 5): `consumer migrate`.

// MigrationPlan is what the positions bucket would hold after the
// migration, subscription by subscription (floors, pending counts, what
// would be re-sent, streams parked and set aside), and the refusals
// that stop it: `consumer migrate --dry-run` prints it (Print).
type MigrationPlan = migrate.Plan

// MigrationResult says what ApplyMigration wrote (or that it found the
// plan applied before: Done).
type MigrationResult = migrate.Result

// ErrMigrationRefused is wrapped by ApplyMigration (and MigrationPlan.Err)
// when the old layout cannot be moved as it is (no partitioned copy, a
// copy partitioned for another count, a partition consumer missing).
var ErrMigrationRefused = migrate.ErrRefused

// MigrationConfig says where the old engine's layout is and what the
// shared engine runs with.
type MigrationConfig struct {
	// Stream is the events stream. Default DefaultStream.
	Stream string
	// DLQStream is the dead-letter stream (a parked head's sequence is
	// read from its dead letter). Default DefaultDLQStream.
	DLQStream string
	// Partitions is the partition count the shared engine runs with;
	// the partitioned copy must be partitioned for the same. Required.
	Partitions int
	// ReadPending reads each unordered durable's pending set back from
	// the stopped durable (pulling, never acking, for up to its AckWait
	// plus its longest BackOff step plus 2 s), so that what it acked
	// above its ack floor is not sent again. Each pull counts as a
	// delivery attempt on the old durable. Default false: those events
	// are counted in the plan as re-sent.
	ReadPending bool
}

// ReadMigrationPlan reads the old engine's layout and plans its move to
// the positions bucket, writing nothing. The subscriptions are those the
// layout holds (their durable consumers). Run it with every consumer
// replica stopped. Errors: Partitions below 1, the events stream
// missing, and the server's; a layout that disagrees is a plan with
// refusals, not an error.
func ReadMigrationPlan(ctx context.Context, js jetstream.JetStream, cfg MigrationConfig) (*MigrationPlan, error) {
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	subs, err := legacy.Discover(ctx, js, cfg.Stream)
	if err != nil {
		return nil, err
	}
	return migrate.ReadPlan(ctx, js, migrate.Config{Events: cfg.Stream, DLQ: cfg.DLQStream, Partitions: cfg.Partitions, Subscriptions: subs, ReadPending: cfg.ReadPending})
}

// ApplyMigration writes plan to the positions bucket (created with the
// events stream's replica count when missing) and turns AllowDirect on
// for the events stream, once: a second run of the same plan writes
// nothing and returns Done. It deletes nothing of the old layout.
// Errors: ErrMigrationRefused, another migration running, a positions
// bucket already written (by another plan, or by the shared engine), and
// the server's.
func ApplyMigration(ctx context.Context, js jetstream.JetStream, plan *MigrationPlan) (MigrationResult, error) {
	return migrate.Apply(ctx, js, plan, "", 0)
}

// MigrationCleanup is what `consumer migrate --cleanup` deletes of the
// old engine's layout once the shared engine runs, kind by kind (the park
// bucket's keys of the old subscriptions and its lease epoch counter, the
// park bucket when left empty, the old lease and heartbeat keys, the
// unordered durables, the partition consumers, the partitioned copy), and
// the refusals that stop it (Err). Print writes it as the command shows
// it.
type MigrationCleanup = cleanup.Leftovers

// Errors a MigrationCleanup's Err wraps.
var (
	// ErrMigrationNotApplied: the positions bucket holds no "migrated"
	// key; run the migration first.
	ErrMigrationNotApplied = cleanup.ErrNotMigrated
	// ErrSharedEngineNotStarted: no partition record was claimed by the
	// shared engine since the migration wrote it; start the new version
	// first (until it ran, the old layout is what going back needs).
	ErrSharedEngineNotStarted = cleanup.ErrNotStarted
	// ErrOldEngineRuns: an old consumer has pull requests waiting, or an
	// old heartbeat was written within the lease bucket's TTL; stop every
	// replica of the old version.
	ErrOldEngineRuns = cleanup.ErrOldEngineRuns
)

// ReadMigrationCleanup lists what the old engine's layout left on the
// events stream stream (default DefaultStream), writing nothing, and
// checks that it may be deleted (MigrationCleanup.Err): the migration
// applied, the shared engine claimed at least one partition since, no
// old replica running. It keeps the dead letters, the positions bucket
// and the shared engine's lease keys. Errors: the events stream missing,
// and the server's.
func ReadMigrationCleanup(ctx context.Context, js jetstream.JetStream, stream string) (*MigrationCleanup, error) {
	if stream == "" {
		stream = DefaultStream
	}
	return cleanup.Read(ctx, js, cleanup.Config{Events: stream})
}

// CleanupMigration deletes what c lists: the park bucket (or its listed
// keys), the old lease keys, the durables, the partition consumers and
// the partitioned copy, in that order, passing over what is gone
// already. Errors: c.Err() (nothing deleted), and the server's.
func CleanupMigration(ctx context.Context, js jetstream.JetStream, c *MigrationCleanup) error {
	return cleanup.Delete(ctx, js, c)
}
