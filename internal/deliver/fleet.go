package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// Fleet runs a set of subscriptions that changes while it runs
// (subscriptions managed at runtime, docs/subscriptions-kv.md). Each
// subscription is a unit of its own, a Consumer of that one subscription
// (an unordered runner, or an ordered subscription's partitions under its
// own membership and leases), which Put starts, updates or restarts and
// Pause or Remove end; the units share the Config's breakers, clock,
// replica id and metrics (registered once), and one health state (one
// watch of the health bucket, one notifier: fleetshared.go). Put, Pause and Remove are
// safe for concurrent use; call Run once.
type Fleet struct {
	js  jetstream.JetStream
	cfg Config // defaults filled once, shared by every unit
	log *slog.Logger

	mu     sync.Mutex
	runCtx context.Context // Run's; nil before Run and after it ended
	units  map[string]*unit
	wg     sync.WaitGroup
	// series are the metric vectors labelled by subscription (series.go):
	// Remove deletes the removed subscription's series.
	series subscriptionSeries
	// provisioning bounds the units creating their durable consumers at
	// once (fleetProvisionParallel): a replica starting with thousands of
	// subscriptions creates them a few at a time instead of flooding
	// JetStream's API with requests that then time out.
	provisioning chan struct{}
}

// fleetProvisionParallel is how many units of a Fleet create their
// durable consumers at once.
const fleetProvisionParallel = 16

// unit is one subscription of a Fleet.
type unit struct {
	sub subscription.Subscription // as given to Put
	c   *Consumer
	// cancel and done are set while it runs.
	cancel context.CancelFunc
	done   chan struct{}
}

// NewFleet returns a Fleet with no subscriptions. cfg's defaults are
// filled once (as New does) so that every unit shares them; the metrics
// are registered on cfg.Registerer now.
func NewFleet(js jetstream.JetStream, cfg Config) (*Fleet, error) {
	if js == nil {
		return nil, errors.New("deliver: new fleet: jetstream.JetStream is nil")
	}
	if err := cfg.fillDefaults(); err != nil {
		return nil, fmt.Errorf("deliver: new fleet: %w", err)
	}
	series, err := newSubscriptionSeries(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("deliver: new fleet: %w", err)
	}
	shared, err := newFleetShared(js, cfg)
	if err != nil {
		return nil, fmt.Errorf("deliver: new fleet: %w", err)
	}
	cfg.fleet = shared
	return &Fleet{js: js, cfg: cfg, log: cfg.Logger, units: map[string]*unit{}, series: series, provisioning: make(chan struct{}, fleetProvisionParallel)}, nil
}

// Provision waits for nothing but the events stream: the units create
// their durable consumers when they start. An error wraps JetStream's
// (jetstream.ErrStreamNotFound while the bridge has not created it).
func (f *Fleet) Provision(ctx context.Context) error {
	if _, err := f.js.Stream(ctx, f.cfg.Stream); err != nil {
		return fmt.Errorf("deliver: JetStream stream %q: %w", f.cfg.Stream, err)
	}
	return nil
}

// Put makes sub run: a new subscription starts (its durable consumers
// are created with its Start); one that runs with other secrets or scheme
// only signs its next attempt with the new ones, in place; one that runs
// with any other change is stopped (its in-flight deliveries finish, what
// it pulled but did not start goes back to JetStream) and started again
// with sub, keeping its durable consumers' position. Before Run, it is
// recorded and Run starts it. An invalid sub is refused
// (subscription.ErrInvalidSubscription) and what runs is kept.
func (f *Fleet) Put(sub subscription.Subscription) error {
	if err := sub.Validate(); err != nil {
		return fmt.Errorf("deliver: fleet: %w", err)
	}
	f.mu.Lock()
	old := f.units[sub.Name]
	f.mu.Unlock()
	if old != nil && old.c != nil && onlySigningChanged(old.sub, sub) {
		d := sub.WithDefaults()
		signer, err := webhook.NewSigner(d.Scheme, d.Secrets...)
		if err != nil {
			return fmt.Errorf("deliver: fleet: subscription %q: %w", sub.Name, err)
		}
		for _, r := range old.c.runners {
			r.snd.SetSigner(signer)
		}
		f.mu.Lock()
		old.sub = sub
		f.mu.Unlock()
		f.log.Info("subscription's signing secrets changed: the next attempt signs with them", slog.String("subscription", sub.Name))
		return nil
	}
	c, err := New(f.js, f.cfg, sub)
	if err != nil {
		return fmt.Errorf("deliver: fleet: %w", err)
	}
	if old != nil {
		f.stop(old)
		f.log.Info("subscription changed: restarting it", slog.String("subscription", sub.Name))
	} else {
		f.log.Info("subscription added", slog.String("subscription", sub.Name), slog.String("start", sub.Start.String()))
	}
	if old == nil {
		f.cfg.fleet.added(sub.Name)
		f.cfg.fleet.units.Add(1)
	}
	u := &unit{sub: sub, c: c}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.units[sub.Name] = u
	if f.runCtx != nil {
		f.start(u)
	}
	return nil
}

// onlySigningChanged reports whether a and b differ in Secrets or Scheme
// alone.
func onlySigningChanged(a, b subscription.Subscription) bool {
	a.Secrets, b.Secrets = nil, nil
	a.Scheme, b.Scheme = "", ""
	return subscription.Equal(a, b)
}

// start runs u under the Fleet's Run context; f.mu is held.
func (f *Fleet) start(u *unit) {
	ctx, cancel := context.WithCancel(f.runCtx)
	u.cancel, u.done = cancel, make(chan struct{})
	f.wg.Go(func() {
		defer close(u.done)
		select {
		case f.provisioning <- struct{}{}:
			// Best effort: Run creates (and retries) what this did not.
			if err := u.c.Provision(ctx); err != nil && ctx.Err() == nil {
				f.log.Debug("subscription's durable consumers not created yet; it retries", slog.String("subscription", u.sub.Name), slog.Any("error", err))
			}
			<-f.provisioning
		case <-ctx.Done():
		}
		_ = u.c.Run(ctx) // always nil: the engine retries what fails
	})
}

// stop ends u and waits until it stopped (its deliveries in flight
// finished, each bounded by its Timeout; an ordered one released its
// partitions).
func (f *Fleet) stop(u *unit) {
	f.mu.Lock()
	cancel, done := u.cancel, u.done
	f.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Pause stops the subscription name on this replica, if it runs, and
// forgets it; its durable consumers keep their position (nothing pulled
// is lost: what was pulled but not started goes back to JetStream, the
// deliveries in flight finish). A later Put resumes it where it stopped.
func (f *Fleet) Pause(name string) {
	f.mu.Lock()
	u := f.units[name]
	delete(f.units, name)
	f.mu.Unlock()
	if u != nil {
		f.cfg.fleet.units.Add(-1)
		f.stop(u)
		f.log.Info("subscription paused: stopped pulling, position kept", slog.String("subscription", name))
	}
}

// Remove stops the subscription name as Pause does, then deletes its
// durable consumers, the unordered one on the events stream and the
// partition consumers on its partitioned copy, whichever exist, and its
// parked-stream state (forgetParked) and failure streak (health.ForgetStreak), and
// deletes its metric series
// (every
// replica does so after stopping its own unit, so the last one to stop
// removes what a slower one may have created again; deleting an absent
// consumer is fine). It returns the first deletion error other than not
// found.
func (f *Fleet) Remove(ctx context.Context, name string) error {
	f.Pause(name)
	f.series.forget(name)
	var first error
	del := func(stream, durable string) {
		err := f.js.DeleteConsumer(ctx, stream, durable)
		if err == nil {
			f.log.Info("durable consumer deleted", slog.String("subscription", name), slog.String("durable", durable), slog.String("jetstream_stream", stream))
			return
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return
		}
		if first == nil {
			first = fmt.Errorf("deliver: subscription %q: delete durable consumer %q on JetStream stream %q: %w", name, durable, stream, err)
		}
	}
	del(f.cfg.Stream, name)
	if _, err := f.js.Stream(ctx, wire.OrderedStream(f.cfg.Stream)); err == nil {
		for p := range f.cfg.Partitions {
			del(wire.OrderedStream(f.cfg.Stream), wire.PartitionDurable(name, p))
		}
	}
	if err := f.forgetParked(ctx, name); err != nil && first == nil {
		first = err
	}
	if err := health.ForgetStreak(ctx, f.js, name); err != nil && first == nil {
		first = err
	}
	f.log.Info("subscription removed", slog.String("subscription", name))
	return first
}

// forgetParked deletes the park bucket's keys of subscription name (its
// parked streams, failed-attempt counts, skipped versions and delivered
// records), so that a subscription added
// again under the name starts with none; its dead letters stay in the
// dead-letter stream.
func (f *Fleet) forgetParked(ctx context.Context, name string) error {
	kv, err := f.js.KeyValue(ctx, wire.DefaultParkBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deliver: subscription %q: key-value bucket %q: %w", name, wire.DefaultParkBucket, err)
	}
	l, err := kv.ListKeysFiltered(ctx, wire.ParkedFilter(name), wire.AttemptsKeyPrefix+name+".*", wire.SkippedKeyPrefix+name+".*", wire.AsideFilter(name), wire.DeliveredKeyPrefix+name+".*")
	if err != nil {
		return fmt.Errorf("deliver: subscription %q: list key-value bucket %q: %w", name, wire.DefaultParkBucket, err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("deliver: subscription %q: purge %q in key-value bucket %q: %w", name, k, wire.DefaultParkBucket, err)
		}
	}
	return nil
}

// Consumer returns the Consumer running the subscription name, or nil
// when the Fleet does not run it (for one-off operations on it, such as
// ReplayWindow).
func (f *Fleet) Consumer(name string) *Consumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if u := f.units[name]; u != nil {
		return u.c
	}
	return nil
}

// Names returns the names of the subscriptions the Fleet runs (or will
// run when Run starts), sorted.
func (f *Fleet) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.units))
}

// Run starts the subscriptions Put so far and those Put later, until ctx
// ends; then it stops every one (as Pause does, all at once) and returns
// nil.
func (f *Fleet) Run(ctx context.Context) error {
	// The units' shared health: read once before they start (so that a
	// disabled subscription does not start), then followed.
	ready := make(chan struct{})
	var shared sync.WaitGroup
	shared.Go(func() { f.cfg.fleet.run(ctx, func() { close(ready) }) })
	select {
	case <-ready:
	case <-ctx.Done():
	}
	f.mu.Lock()
	f.runCtx = ctx
	for _, u := range f.units {
		f.start(u)
	}
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	f.runCtx = nil
	f.mu.Unlock()
	f.wg.Wait()
	shared.Wait()
	return nil
}

// Replay replays dead letters as Consumer.Replay does, each with the unit
// of its subscription; a letter of a subscription the Fleet does not run
// (unknown, paused or removed) gets an error wrapping
// ErrUnknownSubscription.
func (f *Fleet) Replay(ctx context.Context, q *deadletter.DLQ, letters []deadletter.Stored) []ReplayResult {
	out := make([]ReplayResult, 0, len(letters))
	for _, dl := range letters {
		if ctx.Err() != nil {
			break
		}
		f.mu.Lock()
		u := f.units[dl.Subscription]
		f.mu.Unlock()
		if u == nil {
			out = append(out, ReplayResult{Letter: dl, Err: fmt.Errorf("dead letter %d: %w: %q", dl.Seq, ErrUnknownSubscription, dl.Subscription)})
			continue
		}
		out = append(out, u.c.Replay(ctx, q, []deadletter.Stored{dl})...)
	}
	return out
}
