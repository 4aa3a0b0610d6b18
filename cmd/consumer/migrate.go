package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
)

// migrateCmd moves the old engine's layout to the shared engine's
// positions bucket, or with --dry-run only prints the plan; with
// --cleanup it deletes the old layout once the shared engine runs.
type migrateCmd struct {
	DryRun      bool `name:"dry-run" help:"Print the plan (per subscription: floor, pending count, what would be re-sent, parked and set-aside streams; the refusals) and write nothing. With --cleanup: list what would be deleted, and delete nothing."`
	Cleanup     bool `name:"cleanup" help:"Once the migration was applied and the new version runs: delete the old layout (the unordered durables, the partition consumers and the partitioned copy ${events_stream}_ORDERED, the park bucket's keys the migration copied or translated and the bucket when left empty, the old engine's lease and heartbeat keys); the dead letters and the positions bucket stay. Refused before the migration, before the new version claimed a partition, and while an old replica runs (an old consumer with pull requests waiting, pinned to a client, or moving during the second it is watched; or an old heartbeat younger than the lease TTL)."`
	JSON        bool `name:"json" help:"Print the plan (and with a write, the result; with --cleanup, what is deleted) as JSON instead of text."`
	ReadPending bool `name:"read-pending" help:"Read each unordered durable's pending set back (pulling from the stopped durable, never acking, for up to its AckWait plus its longest BackOff step plus 2 s), so that what it acked above its ack floor is not sent again; each pull counts as a delivery attempt on the old durable. Without it, those events are counted as re-sent."`
	Partitions  int  `name:"partitions" env:"JSBRIDGE_PARTITIONS" default:"16" help:"Partitions the shared engine will run with; the partitioned copy (${events_stream}_ORDERED) must be partitioned for the same count, or the migration refuses (default: ${default})."`
	out         io.Writer
}

func (c *migrateCmd) Run(ctx context.Context, g *Globals) error {
	w := out(c.out)
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.Cleanup {
		if c.ReadPending {
			return fmt.Errorf("--read-pending reads the old layout for a migration; --cleanup deletes it: give one of them")
		}
		return c.cleanup(ctx, w, js, g.Stream)
	}
	plan, err := consumer.ReadMigrationPlan(ctx, js, consumer.MigrationConfig{Stream: g.Stream, DLQStream: g.DLQStream, Partitions: c.Partitions, ReadPending: c.ReadPending})
	if err != nil {
		return err
	}
	var res *consumer.MigrationResult
	if !c.DryRun && plan.Err() == nil {
		r, err := consumer.ApplyMigration(ctx, js, plan)
		if err != nil {
			return err
		}
		res = &r
	}
	if c.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Plan   *consumer.MigrationPlan   `json:"plan"`
			Result *consumer.MigrationResult `json:"result,omitempty"`
		}{plan, res}); err != nil {
			return err
		}
	} else if err := plan.Print(w); err != nil {
		return err
	}
	if err := plan.Err(); err != nil || c.JSON {
		return err
	}
	switch {
	case res == nil:
		fmt.Fprintln(w, "\ndry run: nothing written")
	case res.Done && len(plan.Subscriptions) == 0:
		fmt.Fprintln(w, "\nalready migrated, and nothing of the old layout is left to move: nothing written")
	case res.Done:
		fmt.Fprintf(w, "\nalready migrated (fingerprint %s): nothing written\n", plan.Fingerprint)
	default:
		fmt.Fprintf(w, "\nwritten: %d partition records, %d cursor keys", res.Records, res.Cursors)
		if res.AllowDirect {
			fmt.Fprintf(w, "; AllowDirect turned on for %s", plan.Events)
		}
		fmt.Fprintln(w, "\nthe old layout is left as it is: start the new version (consumer run), then delete it with consumer migrate --cleanup")
	}
	return nil
}

// cleanup runs --cleanup: lists the old layout left, and deletes it
// unless --dry-run or refused.
func (c *migrateCmd) cleanup(ctx context.Context, w io.Writer, js jetstream.JetStream, stream string) error {
	cl, err := consumer.ReadMigrationCleanup(ctx, js, stream)
	if err != nil {
		return err
	}
	deleted := false
	if !c.DryRun && cl.Err() == nil && !cl.Empty() {
		if err := consumer.CleanupMigration(ctx, js, cl); err != nil {
			return err
		}
		deleted = true
	}
	if c.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Cleanup *consumer.MigrationCleanup `json:"cleanup"`
			Deleted bool                       `json:"deleted"`
		}{cl, deleted}); err != nil {
			return err
		}
		return cl.Err()
	}
	if err := cl.Print(w); err != nil {
		return err
	}
	if err := cl.Err(); err != nil {
		return err
	}
	switch {
	case cl.Empty():
		fmt.Fprintln(w, "\nnothing to delete: the old layout is gone")
	case c.DryRun:
		fmt.Fprintln(w, "\ndry run: nothing deleted")
	default:
		fmt.Fprintln(w, "\ndeleted")
	}
	return nil
}
