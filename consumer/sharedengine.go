package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
	"github.com/jsbridge/jsbridge/wire"
)

// Errors of the engine's start-up on a deployment the durables engine
// of an earlier release ran and `consumer migrate` has not moved
// (docs/operations.md, "Upgrading from a release that ran the durables engine"); Provision (and
// Start) wrap them and do not wait for them to go away.
var (
	// ErrNoAllowDirect is wrapped when Config.Stream does not allow
	// direct gets, which the shared engine's cursors read with: turn it
	// on with `consumer migrate` or `nats stream edit EVENTS
	// --allow-direct`.
	ErrNoAllowDirect = errors.New("the events stream does not allow direct gets (AllowDirect)")
	// ErrNotMigrated is wrapped when the durables engine's layout is on
	// the server (a subscription's durable consumer on Config.Stream, or
	// the partitioned copy) and the positions bucket does not say it was
	// moved (its "migrated" key): run `consumer migrate` with every
	// replica of the durables engine stopped.
	ErrNotMigrated = errors.New("the durables engine's layout is not migrated to the shared engine")
	// ErrPartitionsChanged is wrapped by Provision when Config.Partitions
	// differs from the count the positions bucket holds (its
	// "partitions" key, written by the first replica or by `consumer
	// migrate`): replicas hashing streams into different counts would
	// deliver one stream from two partitions at once. Run every replica
	// with the stored count: it cannot change in place (docs/operations.md,
	// "The partition count").
	ErrPartitionsChanged = errors.New("the partition count differs from the one the positions bucket holds")
)

// sharedEngine is the shared engine (internal/deliver/shared) as the
// Consumer runs it: one shared.Replica.
type sharedEngine struct {
	r      *shared.Replica
	js     jetstream.JetStream
	stream string
	// partitions and replicas are Config.Partitions and Config.Replicas:
	// Provision checks the first against the positions bucket, which it
	// creates with the second when missing.
	partitions, replicas int
	log                  *slog.Logger
	clock                clockwork.Clock
	// loaded, when not nil, is closed once the subscriptions bucket's
	// subscriptions were applied (Loaded): Run starts the replica only
	// then, since a partition taken with a subscription missing from
	// the member index passes its events over.
	loaded   chan struct{}
	loadOnce sync.Once
	// replayed counts the dead letters Replay delivered (sharedreplay.go).
	replayed *prometheus.CounterVec
}

// sharedDeps are what the Consumer made for its engine.
type sharedDeps struct {
	breakers *breaker.Set
	// letters is the Consumer's dead-letter stream, provisioned by
	// Provision.
	letters *deadletter.DLQ
	// attempts is the attempts record (nil without Config.Attempts),
	// keeping the attempts record says.
	attempts attemptlog.Recorder
	record   attemptlog.Mode
}

// newSharedEngine makes the replica of cfg delivering subs (none when
// the subscriptions come from the bucket: watch puts them).
func newSharedEngine(arch *base.Archetype, js jetstream.JetStream, cfg Config, deps sharedDeps, subs []subscription.Subscription) (*sharedEngine, error) {
	deliveries, err := deliver.DeliveriesCounter(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	dead, err := deliver.DeadLettersCounter(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	replayed, err := deliver.ReplayedCounter(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r, err := shared.New(shared.Config{Archetype: arch, Partitions: cfg.Partitions, Stream: cfg.Stream,
		LeaseTTL: cfg.LeaseTTL, Replicas: cfg.Replicas, Health: cfg.Health.engine(), OrderStuckAfter: cfg.OrderStuckAfter},
		shared.Deps{JetStream: js, Subscriptions: subs, Client: cfg.HTTPClient, Breakers: deps.breakers,
			Deliveries: deliveries, DeadLetters: deps.letters, DeadLettered: dead, Registerer: cfg.Registerer, TracerProvider: cfg.TracerProvider,
			Attempts: deps.attempts, AttemptsRecord: deps.record})
	if err != nil {
		return nil, err
	}
	return &sharedEngine{r: r, js: js, stream: cfg.Stream, partitions: cfg.Partitions, replicas: cfg.Replicas,
		log: arch.Logger, clock: arch.Clock, replayed: replayed}, nil
}

// Provision waits for the events stream (an error wrapping JetStream's,
// retried by the caller), resolves the
// start of the subscriptions given with start new to after its last
// sequence (shared.Replica.ResolveNew), then refuses
// at once what waiting cannot fix: the stream without AllowDirect
// (ErrNoAllowDirect), the durables engine's layout there and not
// migrated (ErrNotMigrated), each message naming `consumer migrate` and
// docs/operations.md's section, and a partition count other than the
// positions bucket's (ErrPartitionsChanged; checkPartitions).
func (e *sharedEngine) Provision(ctx context.Context) error {
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return fmt.Errorf("consumer: JetStream stream %q: %w", e.stream, err)
	}
	if !s.CachedInfo().Config.AllowDirect {
		return fmt.Errorf("consumer: stream %s: %w: stop every replica of an earlier release and run `consumer migrate` (docs/operations.md, \"Upgrading from a release that ran the durables engine\"), or `nats stream edit %s --allow-direct` on a stream no durables engine ran on",
			e.stream, ErrNoAllowDirect, e.stream)
	}
	// A subscription of the file (or Config) with start new begins after
	// the events stored so far: what is stored until Run is its.
	e.r.ResolveNew(s.CachedInfo().State.LastSeq)
	old, err := oldLayout(ctx, e.js, e.stream)
	if err != nil {
		return err
	}
	if old != "" {
		switch migrated, err := isMigrated(ctx, e.js); {
		case err != nil:
			return err
		case !migrated:
			return fmt.Errorf("consumer: %s, and the %s bucket has no %q key: %w: stop every replica of the durables engine and run `consumer migrate` (docs/operations.md, \"Upgrading from a release that ran the durables engine\")",
				old, position.DefaultBucket, mark.DoneKey, ErrNotMigrated)
		}
	}
	return e.checkPartitions(ctx)
}

// checkPartitions compares Config.Partitions with the positions
// bucket's mark.PartitionsKey, creating the bucket (with
// Config.Replicas) and the key when missing. The key is written with a
// create-only put, so of two first replicas with different counts one
// writes it and the other reads it back and is refused. With the key
// missing (a bucket the shared engine of an earlier release wrote), a
// record of partition Config.Partitions shows a larger count ran:
// refused as well. A smaller count that ran before is not seen then;
// the key holds from now on. Errors: ErrPartitionsChanged (wrapped),
// the server's.
func (e *sharedEngine) checkPartitions(ctx context.Context) error {
	kv, err := position.Bucket(ctx, e.js, "", e.replicas)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	want := strconv.Itoa(e.partitions)
	for {
		have, err := kv.Get(ctx, mark.PartitionsKey)
		switch {
		case err == nil && string(have.Value()) == want:
			return nil
		case err == nil:
			return e.partitionsChanged(kv.Bucket(), fmt.Sprintf("%q = %s", mark.PartitionsKey, have.Value()), string(have.Value()))
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("consumer: positions bucket %s: read %q: %w", kv.Bucket(), mark.PartitionsKey, err)
		}
		switch top, err := topRecord(ctx, kv); {
		case err != nil:
			return err
		case top >= e.partitions:
			return e.partitionsChanged(kv.Bucket(), fmt.Sprintf("the record %s of a larger count", position.Key(top)),
				fmt.Sprintf("<the count it ran with, at least %d>", top+1))
		}
		// Create-only: a first replica that lost the race reads the
		// winner's count on the next turn.
		_, err = kv.Create(ctx, mark.PartitionsKey, []byte(want))
		if !errors.Is(err, jetstream.ErrKeyExists) {
			if err != nil {
				return fmt.Errorf("consumer: positions bucket %s: write %q: %w", kv.Bucket(), mark.PartitionsKey, err)
			}
			return nil
		}
	}
}

// topRecord returns the highest partition with a record in the
// positions bucket kv, -1 when none has one.
func topRecord(ctx context.Context, kv jetstream.KeyValue) (int, error) {
	prefix := strings.TrimSuffix(position.Key(0), "0") // "pos.p"
	l, err := kv.ListKeysFiltered(ctx, prefix[:strings.LastIndexByte(prefix, '.')+1]+"*")
	if err != nil {
		return 0, fmt.Errorf("consumer: positions bucket %s: list the records: %w", kv.Bucket(), err)
	}
	defer func() { _ = l.Stop() }()
	top := -1
	for k := range l.Keys() {
		if p, err := strconv.Atoi(strings.TrimPrefix(k, prefix)); err == nil && p > top {
			top = p
		}
	}
	return top, nil
}

// partitionsChanged is ErrPartitionsChanged wrapped with the counts and
// the way out: fix is the count to start with.
func (e *sharedEngine) partitionsChanged(bucket, stored, fix string) error {
	return fmt.Errorf("consumer: --partitions (Config.Partitions) is %d, the positions bucket %s holds %s: %w: start every replica with --partitions %s (the count cannot change in place: docs/operations.md, \"The partition count\")",
		e.partitions, bucket, stored, ErrPartitionsChanged, fix)
}

// Run starts the replica (again with backoff while what it opens fails:
// the buckets, the owner), delivers until ctx ends, then stops it
// gracefully: every partition released with its record committed and
// its lease deleted, so another replica takes over at once.
func (e *sharedEngine) Run(ctx context.Context) error {
	if e.loaded != nil {
		select {
		case <-e.loaded:
		case <-ctx.Done():
			return nil
		}
	}
	var pause backoff.Backoff
	for {
		err := e.r.Start(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		d := pause.Next()
		e.log.Warn("starting the shared engine failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		select {
		case <-ctx.Done():
			return nil
		case <-e.clock.After(d):
		}
	}
	<-ctx.Done()
	e.r.Stop()
	return nil
}

// Put, Pause, Remove and Names are the subscriptions bucket's changes
// (watch), applied to the replica.
func (e *sharedEngine) Put(s subscription.Subscription, created time.Time) error {
	return e.r.PutAt(s, created, false)
}
func (e *sharedEngine) Remove(ctx context.Context, name string) error { return e.r.Remove(ctx, name) }
func (e *sharedEngine) Names() []string                               { return e.r.Names() }

// Deleted remembers that subscription name was deleted from the bucket
// (shared.Replica.Remove of a name it does not deliver): the partitions
// it claims drop what they hold of it.
func (e *sharedEngine) Deleted(ctx context.Context, name string) {
	if err := e.r.Remove(ctx, name); err != nil {
		e.log.Warn("dropping a deleted subscription's held places failed", slog.String("subscription", name), slog.Any("error", err))
	}
}

func (e *sharedEngine) Pause(s subscription.Subscription, created time.Time) {
	if err := e.r.PutAt(s, created, true); err != nil {
		e.log.Error("paused subscription cannot be kept: nothing runs for it", slog.String("subscription", s.Name), slog.Any("error", err))
	}
}

// Loaded ends Run's wait for the bucket's subscriptions.
func (e *sharedEngine) Loaded() {
	if e.loaded != nil {
		e.loadOnce.Do(func() { close(e.loaded) })
	}
}

// oldLayout names what of the durables engine's layout is on the server
// for the events stream ("" when nothing): the partitioned copy, or the
// subscriptions legacy.Discover finds (their durable consumers).
func oldLayout(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	copyName := wire.OrderedStream(stream)
	switch _, err := js.Stream(ctx, copyName); {
	case err == nil:
		return fmt.Sprintf("the partitioned copy %s exists", copyName), nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return "", fmt.Errorf("consumer: JetStream stream %q: %w", copyName, err)
	}
	subs, err := legacy.Discover(ctx, js, stream)
	if err != nil {
		return "", fmt.Errorf("consumer: %w", err)
	}
	if len(subs) > 0 {
		return fmt.Sprintf("the durable consumer %q of %s exists (%d subscriptions of the durables engine)", subs[0].Name, stream, len(subs)), nil
	}
	return "", nil
}

// isMigrated reports whether the positions bucket holds mark.DoneKey.
func isMigrated(ctx context.Context, js jetstream.JetStream) (bool, error) {
	kv, err := js.KeyValue(ctx, position.DefaultBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("consumer: positions bucket %s: %w", position.DefaultBucket, err)
	}
	switch _, err := kv.Get(ctx, mark.DoneKey); {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("consumer: positions bucket %s: %w", position.DefaultBucket, err)
	}
	return true, nil
}
