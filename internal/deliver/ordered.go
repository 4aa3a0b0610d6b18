package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/park"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// Ordered delivery (Subscription.Ordering OrderingStream), in short; the
// design and its failure cases are in docs/ordering.md.
//
//   - A JetStream stream "<events>_ORDERED" sources the events stream with a
//     subject transform that inserts a partition token (fnv32a of the stream
//     token modulo Config.Partitions); the events stream is unchanged.
//   - Each ordered subscription has one durable pull consumer per partition.
//   - Replicas heartbeat into a key-value bucket (TTL Config.LeaseTTL) and
//     each partition is owned by the replica whose lease key it created;
//     each replica keeps up to its quota of what it owns, claims free
//     partitions below it and releases (after its in-flight deliveries)
//     what is over it (see owner.Share: a replica joining or leaving moves
//     about partitions/n of them, not all). A replica stops starting
//     attempts on a partition once its lease was not renewed for
//     LeaseTTL*3/4 (a frozen replica fences itself before its lease can
//     be taken).
//   - A new owner delivers nothing until every message pending on the
//     partition's consumer (the previous owner's in-flight, queued and
//     unacked ones, delivered again at once by a reset of the consumer to
//     its ack floor) is in its hands; then it hands them to the
//     per-stream lanes in stream-sequence order.
//   - Inside a partition, one lane per stream; a failing head is retried in
//     place (InProgress keeps it), acks are double acks.

// orderingDefaults fills the ordered-delivery fields of cfg.
func orderingDefaults(cfg *Config) error {
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.Partitions < 1 || cfg.Partitions > 1024 {
		return fmt.Errorf("Config.Partitions %d: want 1 to 1024", cfg.Partitions)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	switch {
	case cfg.OrderStuckAfter == 0:
		cfg.OrderStuckAfter = DefaultOrderStuckAfter
	case cfg.OrderStuckAfter < 0:
		return fmt.Errorf("Config.OrderStuckAfter %s: want a positive duration", cfg.OrderStuckAfter)
	}
	if cfg.LeaseTTL < 200*time.Millisecond {
		return fmt.Errorf("Config.LeaseTTL %s: want at least 200ms", cfg.LeaseTTL)
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = owner.ReplicaID()
	}
	if !subscription.ValidName(cfg.ReplicaID) {
		return fmt.Errorf("Config.ReplicaID %q does not match [A-Za-z0-9_-]+", cfg.ReplicaID)
	}
	return nil
}

// ordering is the state the ordered subscriptions of one Consumer share:
// the partitioned stream, the buckets, membership and leases.
type ordering struct {
	js      jetstream.JetStream
	cfg     Config // the Consumer's, defaults filled
	clock   clockwork.Clock
	runners []*runner
	log     *slog.Logger
	metrics *metrics

	mu           sync.Mutex
	provisioned  bool
	eventsPrefix string
	leases       jetstream.KeyValue
	parks        jetstream.KeyValue
	buckets      buckets // how provision made leases and parks
	// epochs gives partition claims their lease epochs (a counter in
	// parks).
	epochs owner.Epochs
	// leaseTTL is the lease bucket's TTL: Config.LeaseTTL, unless the
	// bucket existed with another (then every replica goes by the
	// bucket's, so that a lease never expires before its owner renews it).
	leaseTTL time.Duration
	// copyAge is the copy's MaxAge (0: none) as last read, by provision
	// and the copy watcher: parking checks held events' ages against it.
	copyAge atomic.Int64
	// warns paces the warnings of lease writes failing at every cycle.
	warns *owner.WarnPace
	// cycleNow, when it holds a value, starts the next cycle at once: a
	// partition released to another replica finished (see wakeOnFinish).
	cycleNow chan struct{}
	// view is the lease bucket's members, from one watch (set by run
	// once provisioned); sharedView, when not nil, is the view of the
	// Fleet this Consumer is a unit of, which view is then taken from.
	view       *owner.MemberView
	sharedView *sharedMemberView
}

// newOrdering returns the ordering state of c, or nil when no subscription
// of c is ordered.
func newOrdering(c *Consumer) *ordering {
	o := &ordering{js: c.js, cfg: c.cfg, clock: c.cfg.Clock, log: c.log, metrics: c.metrics, warns: owner.NewWarnPace(c.cfg.Clock),
		cycleNow: make(chan struct{}, 1)}
	if c.cfg.fleet != nil {
		o.sharedView = &c.cfg.fleet.members
	}
	for _, r := range c.runners {
		if r.sub.Ordered() {
			r.ord = newOrderedRunner(r, o, c.cfg.Partitions)
			o.runners = append(o.runners, r)
		}
	}
	if len(o.runners) == 0 {
		return nil
	}
	return o
}

// newParking returns the parked streams of r's ordered subscription: the
// park room, handed the copy's MaxAge as o last read it and the
// restoring of o's buckets.
func newParking(r *runner, o *ordering) *park.Parking {
	var m park.Metrics
	if r.metrics != nil {
		m = park.Metrics{Parked: r.metrics.streamsParked, OrderStuck: r.metrics.orderStuck, OldestHeld: r.metrics.oldestHeld}
	}
	return park.New(park.Config{Subscription: r.sub.Name, AckWait: r.sub.AckWait, ReplicaID: r.replicaID, CopyStream: o.stream()}, park.Deps{
		Clock: r.clock, Logger: r.log, Metrics: m,
		CopyMaxAge: func() time.Duration { return time.Duration(o.copyAge.Load()) },
		WatchFailed: func(ctx context.Context, err error) {
			if owner.BucketGone(err) {
				o.buckets.restore(ctx)
			}
		},
	})
}

// stream is the partitioned copy's name.
func (o *ordering) stream() string { return wire.OrderedStream(o.cfg.Stream) }

// provision creates (or checks) the partitioned stream, the two buckets and
// every partition consumer; once it succeeded it does nothing.
func (o *ordering) provision(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provisioned {
		return nil
	}
	js := o.js
	events, err := js.Stream(ctx, o.cfg.Stream)
	if err != nil {
		return fmt.Errorf("deliver: ordered delivery: JetStream stream %q: %w", o.cfg.Stream, err)
	}
	ecfg := events.CachedInfo().Config
	o.eventsPrefix = ordercopy.EventsPrefix(ecfg)
	for _, r := range o.runners {
		for _, f := range r.sub.FilterSubjects {
			if _, err := wire.OrderedFilter(o.eventsPrefix, 0, f); err != nil {
				return fmt.Errorf("deliver: %w %q: FilterSubjects: %w", subscription.ErrInvalidSubscription, r.sub.Name, err)
			}
		}
	}
	replicas := o.cfg.Replicas
	if replicas == 0 {
		replicas = ecfg.Replicas
	}
	maxAge, err := ordercopy.Provision(ctx, js, events, o.cfg.Partitions, replicas, o.log)
	if err != nil {
		return err
	}
	o.copyAge.Store(int64(maxAge)) // the watcher reads it again
	o.buckets = buckets{js: js, log: o.log, leases: jetstream.KeyValueConfig{
		Bucket: wire.DefaultLeaseBucket, Description: "jsbridge consumer replicas and their partition leases",
		TTL: o.cfg.LeaseTTL, Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	}, parks: jetstream.KeyValueConfig{
		Bucket: wire.DefaultParkBucket, Description: "jsbridge ordered subscriptions' parked streams",
		Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	}}
	if o.leases, err = owner.Bucket(ctx, js, o.buckets.leases); err != nil {
		return err
	}
	if o.leaseTTL, err = owner.LeaseTTL(ctx, o.leases, o.cfg.LeaseTTL, o.log); err != nil {
		return err
	}
	if o.parks, err = owner.Bucket(ctx, js, o.buckets.parks); err != nil {
		return err
	}
	o.epochs = owner.Epochs{KV: o.parks}
	for _, r := range o.runners {
		r.ord.parking.Provisioned(o.parks, o.eventsPrefix)
	}
	for _, r := range o.runners {
		if err := r.ord.createConsumers(ctx, o, replicas); err != nil {
			return err
		}
	}
	o.provisioned = true
	return nil
}

// run provisions (retrying), starts the park watchers, then keeps this
// replica's membership and leases until ctx ends; then it releases every
// partition (in-flight deliveries finish, the rest goes back to JetStream)
// and deletes its leases and heartbeat.
func (o *ordering) run(ctx context.Context) {
	var pause backoff.Backoff
	for {
		err := o.provision(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		d := pause.Next()
		o.log.Warn("ordered delivery not available yet; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		sleep(ctx, o.clock, d)
	}
	var watchers sync.WaitGroup
	wctx, stopWatchers := context.WithCancel(context.WithoutCancel(ctx))
	cw := &ordercopy.Watch{JS: o.js, Events: o.cfg.Stream, Every: ordercopy.CheckEvery(o.leaseTTL), Clock: o.clock, Logger: o.log,
		LagMessages: o.metrics.copyLagMsgs, LagSeconds: o.metrics.copyLagSeconds, MaxAge: &o.copyAge}
	watchers.Go(func() { cw.Run(wctx) })
	sw := park.Sweep{JS: o.js, Bucket: o.parks, Clock: o.clock, Logger: o.log}
	for _, r := range o.runners {
		sw.Subscriptions = append(sw.Subscriptions, r.sub.Name)
	}
	watchers.Go(func() { sw.Run(wctx) })
	newView := func() *owner.MemberView {
		return owner.NewMemberView(o.leases, o.leaseTTL, owner.SubscriptionLayout(), o.clock, o.cfg.Logger, func(ctx context.Context, err error) {
			if owner.BucketGone(err) {
				o.buckets.restore(ctx)
			}
		})
	}
	if o.sharedView != nil { // a Fleet's unit: one view for the replica
		o.view = o.sharedView.get(newView)
	} else {
		o.view = newView()
		watchers.Go(func() { o.view.Run(wctx) })
	}
	for _, r := range o.runners {
		ready := make(chan struct{})
		watchers.Go(func() { r.ord.parking.Run(wctx, ready) })
		select {
		case <-ready:
		case <-ctx.Done():
		}
		r.log.Info("subscription started", slog.Any("filter_subjects", r.sub.FilterSubjects), slog.Int("max_in_flight", r.sub.MaxInFlight),
			slog.String("ordering", string(r.sub.Ordering)), slog.Int("partitions", o.cfg.Partitions), slog.String("replica", o.cfg.ReplicaID))
	}
	// A cycle every quarter TTL from the start of the last: timed from
	// its end, a slow cycle (1/2 TTL at most) left the next one's
	// renewals past the deadlines the last one set (3/4 TTL).
	every := o.leaseTTL / 4
	// The first cycle shares from the members the bucket holds: the
	// view's first keys (a cycle at most), not an empty view.
	o.view.WaitLoaded(ctx, every)
	for ctx.Err() == nil {
		began := o.clock.Now()
		o.cycle(ctx)
		select {
		case <-ctx.Done():
		case <-o.clock.After(max(every-o.clock.Since(began), 0)):
		case <-o.cycleNow:
		}
	}
	o.shutdown()
	stopWatchers()
	watchers.Wait()
}

// cycle heartbeats and renews every lease this replica holds, then for
// every ordered subscription releases what is no longer its share and
// claims its share. Membership comes from the member view (one watch of
// the bucket, see owner.MemberView); a subscription's lease keys are listed
// only when this replica is under its quota and may claim (leaseKeys).
//
// The heartbeats and renewals of every ordered subscription of this
// Consumer (several with a configuration file; a Fleet's units run a
// cycle each) go out together at the cycle's start. One subscription
// after the other (a heartbeat, a renewal round trip and a listing each,
// in turn), the last ones' renewals came later in the cycle, and once
// round trips were slow, after the deadlines the last cycle set (its
// start + 3/4 TTL, this cycle's start + TTL/2): their partitions paused.
func (o *ordering) cycle(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, o.leaseTTL/2)
	defer cancel()
	self := o.cfg.ReplicaID
	start := o.clock.Now()
	renewals := make([]map[int]*renewal, len(o.runners))
	beats := make([]error, len(o.runners))
	var wg sync.WaitGroup
	for i, r := range o.runners {
		wg.Go(func() {
			key := wire.MemberKey(r.sub.Name, self)
			o.view.Check(key) // the last cycle's heartbeat came through the watch
			rev, err := o.leases.Put(cctx, key, []byte(self))
			if beats[i] = err; err == nil {
				o.view.Wrote(key, rev)
			}
		})
		wg.Go(func() { renewals[i] = r.ord.renewAll(cctx, o, start) })
	}
	wg.Wait()
	gone := false
	for i, r := range o.runners {
		if err := beats[i]; err != nil {
			o.warns.Warn(r.log, r.sub.Name, "membership heartbeat failed", slog.Any("error", err))
			gone = gone || owner.BucketGone(err)
		}
	}
	if gone {
		o.buckets.restore(ctx) // cctx may be spent on the heartbeats that failed
	}
	for i, r := range o.runners {
		members, err := o.view.Members(r.sub.Name, self)
		if err != nil {
			o.warns.Warn(o.log, "", "the lease bucket's members are not known yet; keeping the current partitions, claiming none", slog.Any("error", err))
		}
		var owned []int
		for p, pt := range r.ord.parts {
			if pt != nil && !pt.lost && pt.ctx.Err() == nil {
				owned = append(owned, p)
			}
		}
		var taken map[int]bool
		listed := true
		if members != nil && len(owned) < owner.Quota(o.cfg.Partitions, members, self) {
			if taken, err = o.leaseKeys(cctx, r.sub.Name); err != nil {
				o.warns.Warn(r.log, r.sub.Name, "listing the subscription's leases failed; claiming nothing this round", slog.Any("error", err))
				listed = false
				if owner.BucketGone(err) {
					o.buckets.restore(ctx)
				}
			}
		}
		keep, _, claim := owner.Share(o.cfg.Partitions, members, self, owned, taken)
		if !listed {
			claim = nil
		}
		// Held partitions first (renewed, or released when no longer
		// wanted), then claims.
		for _, p := range append(r.ord.ownedOrReleasing(), claim...) {
			if err := cctx.Err(); err != nil {
				if !errors.Is(err, context.Canceled) {
					r.log.Warn("lease renewals and claims took longer than half the lease TTL; the rest waits for the next round", slog.Duration("lease_ttl", o.leaseTTL))
				}
				return // or shutting down: shutdown releases everything
			}
			want := slices.Contains(keep, p) || slices.Contains(claim, p)
			r.ord.step(cctx, o, p, want, members == nil, start, renewals[i][p])
		}
		r.ord.report()
	}
}

// leaseKeys returns the partitions of subscription whose lease key
// exists (held by any replica, self included), from one listing of the
// lease bucket.
func (o *ordering) leaseKeys(ctx context.Context, subscription string) (map[int]bool, error) {
	l, err := o.leases.ListKeysFiltered(ctx, wire.SubscriptionLeaseFilter(subscription))
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Stop() }() // the lister stopped itself after the last key
	taken := map[int]bool{}
	for k := range l.Keys() {
		if _, p, ok := wire.ParseLeaseKey(k); ok {
			taken[p] = true
		}
	}
	return taken, nil
}

// shutdown releases every partition and waits for their deliveries, then
// deletes the leases and the heartbeat so that other replicas take over at
// once.
func (o *ordering) shutdown() {
	// Deliveries in flight end within their Timeout.
	wait := 5 * time.Second
	for _, r := range o.runners {
		wait = max(wait, r.sub.Timeout+5*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, r := range o.runners {
		r.ord.releaseAll(ctx, o)
	}
	if o.leases != nil {
		for _, r := range o.runners {
			if err := o.leases.Delete(ctx, wire.MemberKey(r.sub.Name, o.cfg.ReplicaID)); err != nil {
				o.log.Debug("deleting membership heartbeat failed", slog.Any("error", err))
			}
		}
	}
}
