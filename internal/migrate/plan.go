package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// reading is one ReadPlan's state: what it read once and the plan it
// fills.
type reading struct {
	js     jetstream.JetStream
	cfg    Config
	plan   *Plan
	prefix string             // the events stream's subject prefix
	park   jetstream.KeyValue // the park bucket; nil when there is none
	copy   *legacy.CopySeqs   // nil when there is no usable copy
	copyAt int64              // the copy's creation time (Unix ns), as delivered records name it
	// eventsLast is the events stream's last sequence, read before the
	// copy (so that a copy keeping up is never past it).
	eventsLast uint64
	dlq        *deadletter.DLQ
}

// ReadPlan reads the old layout on js and returns what the positions
// bucket would hold after the migration (see the package doc), writing
// nothing of the layout. Two reads go through an ephemeral consumer of
// their own, made and left to expire or deleted: the dead letters of a
// subscription with parked streams (deadletter.DLQ.List), and the lag of
// a copy emptied of every message (legacy.CopySourced); with
// Config.ReadPending it pulls from the unordered durables. Run it with
// every old consumer replica stopped: a running one moves the floors it
// reads. Where the layout disagrees, the plan holds a Refusal (Plan.Err).
// Errors: ErrInvalidConfig (wrapped), the events stream missing, and the
// server's.
func ReadPlan(ctx context.Context, js jetstream.JetStream, cfg Config) (*Plan, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	events, err := js.Stream(ctx, cfg.Events)
	if err != nil {
		return nil, fmt.Errorf("migrate: events stream %q: %w", cfg.Events, err)
	}
	info := events.CachedInfo()
	r := &reading{js: js, cfg: cfg, prefix: legacy.EventsPrefix(info.Config), eventsLast: info.State.LastSeq,
		plan: &Plan{Events: cfg.Events, EventsCreated: info.Created, AllowDirect: info.Config.AllowDirect, Partitions: cfg.Partitions},
		dlq:  deadletter.New(js, deadletter.Config{Stream: cfg.DLQ, SubjectPrefix: cfg.DLQPrefix}),
	}
	switch r.park, err = js.KeyValue(ctx, legacy.ParkBucket); {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		r.park = nil
	case err != nil:
		return nil, fmt.Errorf("migrate: park bucket %q: %w", legacy.ParkBucket, err)
	}
	if slices.ContainsFunc(cfg.Subscriptions, func(s legacy.Subscription) bool { return s.Ordered }) {
		if err := r.openCopy(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.parkKeys(ctx); err != nil {
		return nil, err
	}
	var parts []*partitionState
	for _, sub := range cfg.Subscriptions {
		var sp SubscriptionPlan
		var err error
		if sub.Ordered {
			var ps []*partitionState
			sp, ps, err = r.ordered(ctx, sub.Name)
			parts = append(parts, ps...)
		} else {
			sp, err = r.unordered(ctx, sub.Name)
		}
		if err != nil {
			return nil, err
		}
		r.plan.Subscriptions = append(r.plan.Subscriptions, sp)
	}
	r.records(parts)
	r.plan.Fingerprint = r.plan.fingerprint()
	return r.plan, nil
}

// openCopy finds the partitioned copy and checks its transform against
// Config.Partitions; a copy missing or partitioned otherwise is refused.
func (r *reading) openCopy(ctx context.Context) error {
	name := legacy.CopyStream(r.cfg.Events)
	r.plan.Copy = name
	s, err := r.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		r.plan.refuse("", -1, "the partitioned copy %q does not exist: the ordered subscriptions' floors are copy sequences, and nothing translates them (was it deleted? their partition consumers went with it)", name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: partitioned copy %q: %w", name, err)
	}
	want := legacy.CopySource(r.cfg.Events, r.prefix, r.cfg.Partitions).SubjectTransforms[0]
	var have []string
	for _, s := range s.CachedInfo().Config.Sources {
		for _, tr := range s.SubjectTransforms {
			have = append(have, tr.Source+" → "+tr.Destination)
		}
	}
	if len(have) != 1 || have[0] != want.Source+" → "+want.Destination {
		r.plan.refuse("", -1, "the partitioned copy %q transforms %q, not %q: it was partitioned for another count than --partitions %d; run the new engine with the copy's count (changing it is a later, offline step)",
			name, strings.Join(have, ", "), want.Source+" → "+want.Destination, r.cfg.Partitions)
		return nil
	}
	sourced, err := legacy.CopySourced(ctx, r.js, s, r.cfg.Events)
	if errors.Is(err, legacy.ErrNotACopy) {
		r.plan.refuse("", -1, "%q does not source the events stream %q alone: %v", name, r.cfg.Events, err)
		return nil
	}
	if err != nil {
		return err
	}
	r.plan.Sourced = sourced
	if sourced > r.eventsLast {
		r.plan.refuse("", -1, "the partitioned copy %q sourced the events stream up to %d, past its last sequence %d: the events stream was made again, and the copy's sequences name events of the old one", name, sourced, r.eventsLast)
		return nil
	}
	r.copy = legacy.NewCopySeqs(s, sourced)
	r.copyAt = s.CachedInfo().Created.UnixNano()
	return nil
}

// parkKeys reads the lease epoch counter and the moved subscriptions'
// skipped-version records from the park bucket.
func (r *reading) parkKeys(ctx context.Context) error {
	if r.park == nil {
		return nil
	}
	e, err := r.park.Get(ctx, wire.EpochKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("migrate: read %q of the park bucket: %w", wire.EpochKey, err)
	default:
		if r.plan.Epoch, err = strconv.ParseUint(string(e.Value()), 10, 64); err != nil {
			r.plan.refuse("", -1, "the lease epoch counter %q holds %q, not a base-10 integer", wire.EpochKey, e.Value())
		}
	}
	for _, sub := range r.cfg.Subscriptions {
		if !sub.Ordered {
			continue
		}
		entries, err := legacy.ParkEntries(ctx, r.park, wire.SkippedKeyPrefix+sub.Name+".*")
		if err != nil {
			return err
		}
		for _, e := range entries {
			if r.plan.Skipped == nil {
				r.plan.Skipped = map[string]string{}
			}
			r.plan.Skipped[e.Key()] = string(e.Value())
		}
	}
	return nil
}

// fingerprint hashes what the plan writes.
func (p *Plan) fingerprint() string {
	b, err := json.Marshal(struct {
		Partitions int
		Epoch      uint64
		Skipped    map[string]string
		Records    []position.Record
		Cursors    []CursorPlan
	}{p.Partitions, p.Epoch, p.Skipped, p.Records, p.Cursors})
	if err != nil {
		panic(err) // plain values: never
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
