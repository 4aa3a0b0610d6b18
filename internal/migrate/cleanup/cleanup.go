// Package cleanup deletes what the old layout (package legacy) left once
// the shared engine runs: `consumer migrate --cleanup`
// (docs/design/next-engine.md, section 5, step 5). Read lists it, and
// Delete deletes it: the unordered durables on the events stream, the
// partitioned copy with its partition consumers, the park bucket's keys
// migrate.Apply copied or translated (and the bucket, when nothing else
// is left in it), and the old engine's keys in the lease bucket. It
// keeps what the shared engine reads: the dead letters (their stream),
// the positions bucket, and the lease bucket with the shared engine's
// own keys (lease.p<N>, member.<replica>). Read refuses (Leftovers.Err)
// before the migration was applied (package mark's DoneKey), before the
// shared engine claimed a partition record since, and while a replica of
// the old engine runs.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

var (
	// ErrNotMigrated is wrapped by Leftovers.Err when the positions bucket
	// holds no mark.DoneKey: the old layout is all there is of the positions.
	ErrNotMigrated = errors.New("migrate: the migration was not applied")
	// ErrNotStarted is wrapped by Leftovers.Err when no partition record
	// was claimed by the shared engine since the migration wrote it:
	// until the new version ran, the old layout is what going back needs.
	ErrNotStarted = errors.New("migrate: the shared engine has not run on the migrated positions")
	// ErrOldEngineRuns is wrapped by Leftovers.Err when a replica of the old
	// engine still runs (see Read for what shows it).
	ErrOldEngineRuns = errors.New("migrate: a replica of the old engine still runs")
)

// Config says where the old layout and the positions bucket are.
type Config struct {
	// Events is the events stream. Default wire.DefaultEventsStream.
	Events string
	// Positions is the positions bucket. Default position.DefaultBucket.
	Positions string
	// Archetype is the engine's; its clock dates the old heartbeats
	// (ErrOldEngineRuns) and times the Watch. Default base.Default (the
	// real clock).
	*base.Archetype
	// Watch is how long the old consumers are watched for deliveries and
	// acks (a replica busy delivering has no pull request waiting).
	// Default 1 s (defaultWatch).
	Watch time.Duration
}

// defaultWatch is Config.Watch's default: long enough for a
// replica delivering to an endpoint answering within a second to move its
// consumers' delivered or acked sequence.
const defaultWatch = time.Second

// Leftovers is what the cleanup deletes, or would delete (Read),
// in the order Delete deletes it, and what stops it.
type Leftovers struct {
	// Events is the events stream, Positions the positions bucket (kept);
	// Migrated the fingerprint of the plan applied (mark.DoneKey), "" when
	// none was.
	Events    string `json:"events"`
	Positions string `json:"positions"`
	Migrated  string `json:"migrated"`
	// ParkKeys are the park bucket's keys of the old subscriptions
	// (delivered records, aside records, park entries, skipped versions,
	// failed-attempt counts) and its lease epoch counter, all copied or
	// translated by migrate.Apply.
	ParkKeys []string `json:"park_keys,omitempty"`
	// ParkBucket is the park bucket, deleted after its keys when nothing
	// else is left in it ("" when it stays, or is gone already);
	// ParkKept counts the keys left in it (of subscriptions the old
	// layout no longer has consumers for: not moved, not deleted).
	ParkBucket string `json:"park_bucket,omitempty"`
	ParkKept   int    `json:"park_kept,omitempty"`
	// LeaseKeys are the old engine's keys in the lease bucket: partition
	// leases lease.<subscription>.<p> and heartbeats
	// member.<subscription>.<replica> (both three tokens; the shared
	// engine's have two).
	LeaseKeys []string `json:"lease_keys,omitempty"`
	// Durables are the unordered subscriptions' durable consumers on the
	// events stream (those the old engine made: legacy.DurableDescription).
	Durables []string `json:"durables,omitempty"`
	// Copy is the partitioned copy, deleted last with its consumers
	// ("" when it is gone already); PartitionConsumers are its partition
	// consumers (PartitionDurable), deleted one by one first.
	// CopyKept names the copy's other consumers, when it has some: then
	// the copy stays.
	Copy               string   `json:"copy,omitempty"`
	PartitionConsumers []string `json:"partition_consumers,omitempty"`
	CopyKept           []string `json:"copy_kept,omitempty"`
	// Refusals say why nothing is deleted (see Err).
	Refusals []string `json:"refusals,omitempty"`

	errs []error
}

// Empty reports whether nothing is left to delete.
func (c *Leftovers) Empty() bool {
	return len(c.ParkKeys) == 0 && c.ParkBucket == "" && len(c.LeaseKeys) == 0 && len(c.Durables) == 0 &&
		len(c.PartitionConsumers) == 0 && c.Copy == ""
}

// Err returns nil when the cleanup may run, else the refusals joined,
// each wrapping ErrNotMigrated, ErrNotStarted or ErrOldEngineRuns.
func (c *Leftovers) Err() error { return errors.Join(c.errs...) }

func (c *Leftovers) refuse(err error, format string, args ...any) {
	err = fmt.Errorf("%w: "+format, append([]any{err}, args...)...)
	c.errs = append(c.errs, err)
	c.Refusals = append(c.Refusals, err.Error())
}

// cleaning is one Read's state.
type cleaning struct {
	js  jetstream.JetStream
	cfg Config
	c   *Leftovers
	// subs are the old layout's subscriptions, by name.
	subs []string
	// consumers are the old consumers' info, for the running check.
	consumers []*jetstream.ConsumerInfo
}

// Read lists what the old layout left, writing nothing, and says
// whether it may be deleted (Leftovers.Err): the migration must have been
// applied (mark.DoneKey), the shared engine must have claimed at least one
// partition record since, and no old replica may run. "Runs" is what the
// server answers, any of:
//   - an old consumer with pull requests waiting (ConsumerInfo's
//     NumWaiting; the server drops the requests of a connection gone
//     when it answers): an idle replica's long poll;
//   - a partition consumer pinned to a client (its priority group's
//     PinnedClientID): a replica owns the partition (a graceful stop
//     unpins at once; after a crash the pin lasts the group's pinned TTL);
//   - an old consumer whose delivered or acked sequence moved while it
//     was watched (Config.Watch): a replica busy delivering, whose
//     pulls are all answered;
//   - an old heartbeat member.<subscription>.<replica> written within the
//     lease bucket's TTL (an old replica deletes its own when it stops;
//     one that crashed leaves it until the TTL).
//
// A replica whose deliveries all wait on an endpoint (its in-flight
// limit reached, no pull waiting) or its open breakers, and that runs no
// ordered subscription, shows none of these. The subscriptions are
// those the old layout still has consumers for (legacy.Discover), so a run that
// stopped midway is finished by running it again: Delete
// deletes the keys before the consumers that name them. When nothing of
// the old layout is left (deleted already, or never there) nothing is
// refused. Errors: the events stream missing, and the server's.
func Read(ctx context.Context, js jetstream.JetStream, cfg Config) (*Leftovers, error) {
	if cfg.Events == "" {
		cfg.Events = wire.DefaultEventsStream
	}
	if cfg.Positions == "" {
		cfg.Positions = position.DefaultBucket
	}
	cfg.Archetype = base.Default(cfg.Archetype)
	if cfg.Watch <= 0 {
		cfg.Watch = defaultWatch
	}
	cl := &cleaning{js: js, cfg: cfg, c: &Leftovers{Events: cfg.Events, Positions: cfg.Positions}}
	subs, err := legacy.Discover(ctx, js, cfg.Events)
	if err != nil {
		return nil, err
	}
	for _, s := range subs {
		cl.subs = append(cl.subs, s.Name)
	}
	if err := cl.migrated(ctx); err != nil {
		return nil, err
	}
	if err := cl.parkKeys(ctx); err != nil {
		return nil, err
	}
	beats, err := cl.leaseKeys(ctx)
	if err != nil {
		return nil, err
	}
	if err := cl.durables(ctx); err != nil {
		return nil, err
	}
	if err := cl.copyStream(ctx); err != nil {
		return nil, err
	}
	moved, err := cl.watch(ctx)
	if err != nil {
		return nil, err
	}
	cl.running(beats, moved)
	if cl.c.Empty() {
		cl.c.errs, cl.c.Refusals = nil, nil // nothing to keep for anyone
	}
	return cl.c, nil
}

// watch reads the old consumers' info again after Config.Watch
// and names those whose delivered or acked sequence moved meanwhile.
func (cl *cleaning) watch(ctx context.Context) ([]string, error) {
	if len(cl.consumers) == 0 {
		return nil, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-cl.cfg.Clock.After(cl.cfg.Watch):
	}
	var moved []string
	for _, before := range cl.consumers {
		c, err := cl.js.Consumer(ctx, before.Stream, before.Name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: consumer %q of %q: %w", before.Name, before.Stream, err)
		}
		now := c.CachedInfo()
		if now.Delivered.Stream != before.Delivered.Stream || now.AckFloor.Stream != before.AckFloor.Stream {
			moved = append(moved, fmt.Sprintf("%s on %s (delivered %d → %d, ack floor %d → %d in %s)", before.Name, before.Stream,
				before.Delivered.Stream, now.Delivered.Stream, before.AckFloor.Stream, now.AckFloor.Stream, cl.cfg.Watch))
		}
	}
	return moved, nil
}

// running refuses when an old consumer has pull requests waiting, is
// pinned, or moved while watched, or an old heartbeat is recent.
func (cl *cleaning) running(beats, moved []string) {
	var live []string
	for _, ci := range cl.consumers {
		if ci.NumWaiting > 0 {
			live = append(live, fmt.Sprintf("%s on %s (%d pull requests waiting)", ci.Name, ci.Stream, ci.NumWaiting))
		}
		for _, g := range ci.PriorityGroups {
			if g.PinnedClientID != "" {
				live = append(live, fmt.Sprintf("%s on %s (pinned to client %s of priority group %s)", ci.Name, ci.Stream, g.PinnedClientID, g.Group))
			}
		}
	}
	live = append(live, moved...)
	if len(live) > 0 {
		cl.c.refuse(ErrOldEngineRuns, "%s: stop every replica of the old version, then clean up", strings.Join(live, ", "))
	}
	if len(beats) > 0 {
		cl.c.refuse(ErrOldEngineRuns, "old heartbeats in %q: %s: stop every replica of the old version; one that crashed leaves its heartbeat until the lease TTL, so run this again after it", wire.DefaultLeaseBucket, strings.Join(beats, ", "))
	}
}

// Delete deletes what c lists, in its order: the park bucket
// (whole when nothing else is left in it, else its listed keys, purged), the
// old lease keys, the unordered durables, the partition consumers, and
// last the partitioned copy. What is gone already is passed over, so a
// run that stopped midway is finished by reading and deleting again.
// Errors: c.Err() (nothing deleted), and the server's.
func Delete(ctx context.Context, js jetstream.JetStream, c *Leftovers) error {
	if err := c.Err(); err != nil {
		return err
	}
	switch {
	case c.ParkBucket != "":
		if err := js.DeleteKeyValue(ctx, c.ParkBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("migrate: delete the park bucket %q: %w", c.ParkBucket, err)
		}
	case len(c.ParkKeys) > 0:
		kv, err := js.KeyValue(ctx, legacy.ParkBucket)
		if err != nil {
			return fmt.Errorf("migrate: park bucket %q: %w", legacy.ParkBucket, err)
		}
		for _, k := range c.ParkKeys {
			if err := kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("migrate: delete %q of the park bucket: %w", k, err)
			}
		}
	}
	if len(c.LeaseKeys) > 0 {
		kv, err := js.KeyValue(ctx, wire.DefaultLeaseBucket)
		if err != nil {
			return fmt.Errorf("migrate: lease bucket %q: %w", wire.DefaultLeaseBucket, err)
		}
		for _, k := range c.LeaseKeys {
			if err := kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("migrate: delete %q of the lease bucket: %w", k, err)
			}
		}
	}
	for _, d := range c.Durables {
		if err := js.DeleteConsumer(ctx, c.Events, d); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("migrate: delete the durable consumer %q of %q: %w", d, c.Events, err)
		}
	}
	copyName := legacy.CopyStream(c.Events)
	for _, d := range c.PartitionConsumers {
		if err := js.DeleteConsumer(ctx, copyName, d); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("migrate: delete the partition consumer %q of %q: %w", d, copyName, err)
		}
	}
	if c.Copy != "" {
		if err := js.DeleteStream(ctx, c.Copy); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("migrate: delete the partitioned copy %q: %w", c.Copy, err)
		}
	}
	return nil
}
