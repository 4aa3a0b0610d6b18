package consumer

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/migrate"
)

// The move from the per-subscription durables to the shared engine's
// positions bucket (docs/operations.md, "Moving to shared readers";
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

// ReadMigrationPlan reads the old engine's layout for the events stream
// events (DefaultStream when empty) and plans its move to the positions
// bucket for partitions partitions, writing nothing. The subscriptions
// are those the layout holds (their durable consumers). Run it with
// every consumer replica stopped. Errors: partitions below 1, the events
// stream missing, and the server's; a layout that disagrees is a plan
// with refusals, not an error.
func ReadMigrationPlan(ctx context.Context, js jetstream.JetStream, events, dlq string, partitions int) (*MigrationPlan, error) {
	if events == "" {
		events = DefaultStream
	}
	subs, err := migrate.Discover(ctx, js, events)
	if err != nil {
		return nil, err
	}
	return migrate.ReadPlan(ctx, js, migrate.Config{Events: events, DLQ: dlq, Partitions: partitions, Subscriptions: subs})
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
