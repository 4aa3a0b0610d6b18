package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/wire"
)

// migrateOut runs `consumer migrate <args>` as the binary does, against
// k's server, and returns what it printed and the command's error.
func (k *runtimeKit) migrateOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var cl cli
	parser, err := kong.New(&cl, kong.Name("consumer"), ops.WireVars(), kong.Exit(func(int) { t.Fatal("kong exit") }))
	require.NoError(t, err)
	kctx, err := parser.Parse(append([]string{"migrate", "--nats-url", k.srv.ClientURL()}, args...))
	require.NoError(t, err)
	var out strings.Builder
	cl.Migrate.out = &out
	kctx.BindTo(k.ctx, (*context.Context)(nil))
	err = kctx.Run(&cl.Globals)
	return out.String(), err
}

// oldOrderedLayout makes the old engine's layout of one ordered
// subscription, billing, on 4 partitions: the events stream without
// AllowDirect (as the releases that ran it made it), the partitioned copy
// and its partition consumers.
func oldOrderedLayout(t *testing.T, k *runtimeKit) {
	t.Helper()
	events, err := k.js.Stream(k.ctx, wire.DefaultEventsStream)
	require.NoError(t, err)
	cfg := events.CachedInfo().Config
	cfg.AllowDirect = false
	_, err = k.js.UpdateStream(k.ctx, cfg)
	require.NoError(t, err)
	// The old layout's names (package legacy's, which cmd does not
	// import): the copy's transform for 4 partitions, and the partition
	// consumers "<subscription>_p<p>" on "ordered.<prefix>.<p>.>".
	_, err = k.js.CreateStream(k.ctx, jetstream.StreamConfig{
		Name: wire.OrderedStream(wire.DefaultEventsStream), Storage: jetstream.FileStorage,
		Sources: []*jetstream.StreamSource{{Name: wire.DefaultEventsStream, SubjectTransforms: []jetstream.SubjectTransformConfig{{
			Source:      wire.DefaultEventsPrefix + ".*.*.*",
			Destination: "ordered." + wire.DefaultEventsPrefix + ".{{partition(4,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}",
		}}}},
	})
	require.NoError(t, err)
	for p := range 4 {
		_, err = k.js.CreateConsumer(k.ctx, wire.OrderedStream(wire.DefaultEventsStream), jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("billing_p%d", p), FilterSubject: fmt.Sprintf("ordered.%s.%d.>", wire.DefaultEventsPrefix, p), AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
		})
		require.NoError(t, err)
	}
}

// consumer migrate --dry-run prints the plan and writes nothing; a copy
// partitioned for another count than --partitions is refused, naming
// both; without --dry-run the plan is written once, and a second run
// finds it done.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	oldOrderedLayout(t, k)

	out, err := k.migrateOut(t, "--dry-run")
	require.ErrorContains(t, err, "partitioned for another count than --partitions 16")
	require.Contains(t, out, "subscription billing (ordered)")
	require.Contains(t, out, "refused:")
	_, err = k.js.KeyValue(k.ctx, "jsbridge_positions")
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound, "a dry run writes nothing")

	out, err = k.migrateOut(t, "--dry-run", "--partitions", "4")
	require.NoError(t, err)
	require.Contains(t, out, "subscription billing (ordered): floor 0, pending 0, re-sent 0")
	require.Contains(t, out, "dry run: nothing written")

	out, err = k.migrateOut(t, "--dry-run", "--partitions", "4", "--json")
	require.NoError(t, err)
	var doc struct {
		Plan struct {
			Partitions    int `json:"partitions"`
			Subscriptions []struct {
				Name    string `json:"name"`
				Ordered bool   `json:"ordered"`
			} `json:"subscriptions"`
		} `json:"plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, 4, doc.Plan.Partitions)
	require.Len(t, doc.Plan.Subscriptions, 1)
	require.True(t, doc.Plan.Subscriptions[0].Ordered)

	out, err = k.migrateOut(t, "--partitions", "4")
	require.NoError(t, err)
	require.Contains(t, out, "written: 4 partition records, 0 cursor keys; AllowDirect turned on for "+wire.DefaultEventsStream)
	out, err = k.migrateOut(t, "--partitions", "4")
	require.NoError(t, err)
	require.Contains(t, out, "already migrated")
}

// consumer migrate --cleanup is refused before the migration, and after
// it until the shared engine claimed a partition; --dry-run lists what it
// would delete all the same, as text and as JSON. Once a replica of the
// shared engine runs, it deletes the old layout, and a second run finds
// nothing to do.
func TestMigrateCleanupCommand(t *testing.T) {
	t.Parallel()
	k := newRuntimeKit(t)
	oldOrderedLayout(t, k)
	copyName := wire.OrderedStream(wire.DefaultEventsStream)

	out, err := k.migrateOut(t, "--cleanup")
	require.ErrorIs(t, err, consumer.ErrMigrationNotApplied)
	require.Contains(t, out, "refused:")
	require.Contains(t, out, "run `consumer migrate`")
	_, err = k.migrateOut(t, "--cleanup", "--read-pending")
	require.ErrorContains(t, err, "give one of them")

	_, err = k.migrateOut(t, "--partitions", "4")
	require.NoError(t, err)
	out, err = k.migrateOut(t, "--cleanup", "--dry-run")
	require.ErrorIs(t, err, consumer.ErrSharedEngineNotStarted)
	require.Contains(t, out, "partition consumers on "+copyName+" (4):\n    billing_p0\n")
	require.Contains(t, out, "  partitioned copy "+copyName+"\n")
	require.Contains(t, out, "start the new version (consumer run")

	out, err = k.migrateOut(t, "--cleanup", "--json")
	require.ErrorIs(t, err, consumer.ErrSharedEngineNotStarted)
	var doc struct {
		Cleanup struct {
			Migrated           string   `json:"migrated"`
			Copy               string   `json:"copy"`
			PartitionConsumers []string `json:"partition_consumers"`
			Refusals           []string `json:"refusals"`
		} `json:"cleanup"`
		Deleted bool `json:"deleted"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.False(t, doc.Deleted)
	require.NotEmpty(t, doc.Cleanup.Migrated)
	require.Equal(t, copyName, doc.Cleanup.Copy)
	require.Len(t, doc.Cleanup.PartitionConsumers, 4)
	require.Len(t, doc.Cleanup.Refusals, 1)
	_, err = k.js.Stream(k.ctx, copyName)
	require.NoError(t, err, "nothing was deleted")

	// The shared engine runs (its replica claims the partitions): the
	// old layout is deleted, and a second run finds nothing to do.
	c, err := consumer.New(k.js, consumer.Config{Partitions: 4, ReplicaID: "replica-1",
		Subscriptions: []consumer.Subscription{{Name: "billing", FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)},
			URL: "http://127.0.0.1:1/hook", Secrets: []string{secretA}, AllowPrivate: true,
			Ordering: consumer.OrderingStream}}})
	require.NoError(t, err)
	require.NoError(t, c.Start(k.ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	require.Eventually(t, func() bool { return c.Ready(k.ctx) == nil }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		_, err := k.migrateOut(t, "--cleanup", "--dry-run")
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the shared engine claims a partition")
	out, err = k.migrateOut(t, "--cleanup")
	require.NoError(t, err, out)
	require.Contains(t, out, "partition consumers on "+copyName+" (4):")
	require.Contains(t, out, "\ndeleted\n")
	_, err = k.js.Stream(k.ctx, copyName)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	out, err = k.migrateOut(t, "--cleanup")
	require.NoError(t, err, out)
	require.Contains(t, out, "nothing left to delete")
	require.Contains(t, out, "nothing to delete: the old layout is gone")
	out, err = k.migrateOut(t, "--partitions", "4")
	require.NoError(t, err, out)
	require.Contains(t, out, "already migrated, and nothing of the old layout is left to move")
	require.NoError(t, c.Stop(k.ctx))
}
