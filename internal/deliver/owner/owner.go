package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
	"github.com/jsbridge/jsbridge/wire"
)

// Defaults of Config.
const (
	// DefaultLeaseTTL is Config.LeaseTTL's default: the lease bucket's
	// key TTL, 10 s.
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL is the shortest Config.LeaseTTL accepted.
	MinLeaseTTL = 200 * time.Millisecond
	// MaxPartitions is the largest Config.Partitions accepted.
	MaxPartitions = 1024
)

// Why a claim ends: the cause of its Context (context.Cause).
var (
	// ErrLeaseLost: a renewal found the lease key taken (expired and
	// claimed by another replica, or overwritten), or the lease deadline
	// passed (on either clock) without a renewal. The fence refuses at
	// once and running POSTs are cut.
	ErrLeaseLost = errors.New("owner: the partition's lease was lost")
	// ErrReleased: the share moved the partition to another replica; its
	// POSTs running may finish (the lease is renewed until Done).
	ErrReleased = errors.New("owner: the partition is another replica's share now")
	// ErrStopping: the Owner is stopping and releases every partition.
	ErrStopping = errors.New("owner: the replica is stopping")
)

// Config is one replica's ownership of the partitions.
type Config struct {
	// Archetype is the engine's clock (the cycles, the lease deadlines,
	// the release wait), logger and replica id (the value of the lease
	// keys and the heartbeat; [A-Za-z0-9_-]+). Default base.Default.
	*base.Archetype
	// Partitions is P, the number of partitions (wire.Partition). It must
	// agree on every replica. Required; 1 to MaxPartitions.
	Partitions int
	// Bucket is the lease bucket's name. Default wire.DefaultLeaseBucket.
	Bucket string
	// LeaseTTL is the lease bucket's key TTL, used when the bucket is
	// created; an existing bucket's own TTL wins (LeaseTTL warns).
	// Renewals run every TTL/4 and the fence's deadline is a renewal's
	// start plus 3/4 TTL. Default DefaultLeaseTTL; at least MinLeaseTTL.
	LeaseTTL time.Duration
	// Replicas is the lease bucket's replica count when it is created
	// (0: the server's default, 1).
	Replicas int
	// ReleaseWait bounds how long Stop waits for the claims it releases
	// to be Done (on the archetype's clock, as all the engine's time: a
	// test on a fake clock advances it), after which their leases are
	// left to expire. Default LeaseTTL; negative refused.
	ReleaseWait time.Duration
}

// withDefaults returns c with its defaults, or an error naming the field.
func (c Config) withDefaults() (Config, error) {
	c.Archetype = base.Default(c.Archetype)
	switch {
	case !base.ValidReplica(c.Replica):
		return c, fmt.Errorf("owner: Config.Replica %q does not match [A-Za-z0-9_-]+", c.Replica)
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return c, fmt.Errorf("owner: Config.Partitions %d: want 1 to %d", c.Partitions, MaxPartitions)
	case c.LeaseTTL != 0 && c.LeaseTTL < MinLeaseTTL:
		return c, fmt.Errorf("owner: Config.LeaseTTL %s: want at least %s", c.LeaseTTL, MinLeaseTTL)
	case c.ReleaseWait < 0:
		return c, fmt.Errorf("owner: Config.ReleaseWait %s is negative", c.ReleaseWait)
	case c.Replicas < 0:
		return c, fmt.Errorf("owner: Config.Replicas %d is negative", c.Replicas)
	}
	if c.Bucket == "" {
		c.Bucket = wire.DefaultLeaseBucket
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.ReleaseWait == 0 {
		c.ReleaseWait = c.LeaseTTL
	}
	return c, nil
}

// Callbacks are what the Owner tells its caller, from its cycle's
// goroutine (or a lease deadline's timer): neither may block, and
// neither may call the Owner back except Claim.Done.
type Callbacks struct {
	// Gained is called once a partition was claimed: its lease key
	// created and its epoch taken. The caller starts the partition's
	// work, asks c.Fence before each POST, and calls c.Done when the
	// work ended after c.Context ended. Required.
	Gained func(c *Claim)
	// Releasing is called once c's Context ended (its cause is
	// ErrLeaseLost, ErrReleased or ErrStopping): the caller stops
	// starting work for the partition at once, lets what runs finish
	// (what is past the fence was cut already) and calls c.Done. Nil:
	// the caller watches c.Context instead.
	Releasing func(c *Claim)
}

// Deps are what an Owner uses.
type Deps struct {
	// JetStream is the replica's connection: the lease bucket is opened
	// (created when missing, again when deleted) on it. Required.
	JetStream jetstream.JetStream
	// Epochs hands out the claims' epochs (the positions bucket's
	// counter). Required: Epochs.KV not nil.
	Epochs Epochs
}

// Claim is one partition owned by this replica, from its claim to its
// release: Partition, Epoch and Fence are set once.
type Claim struct {
	// Partition is the partition's number, 0 to Config.Partitions-1.
	Partition int
	// Epoch is the claim's lease epoch (Epochs.Next): above every epoch
	// an earlier claim of the partition used. Every ordered webhook sent
	// under this claim carries it (wire.HeaderLeaseEpoch).
	Epoch uint64
	// Fence is the claim's lease fence: a sender asks Fence.MayStart, or
	// binds its POST with Fence.Bound, before each POST.
	Fence *Fence

	cancel context.CancelCauseFunc
	done   chan struct{} // closed by Done
	once   sync.Once
	o      *Owner

	// Guarded by o.mu.
	rev    uint64          // the lease key's revision as last written
	ending bool            // its context ended: released, lost or stopping
	lost   bool            // the lease is someone else's (or may be): not renewed
	timer  clockwork.Timer // the deadline's (watchDeadline)
	told   bool            // Releasing was called
}

// Context ends when the partition is released or lost; its cause
// (context.Cause) is ErrLeaseLost, ErrReleased or ErrStopping.
func (c *Claim) Context() context.Context { return c.Fence.Context() }

// Done tells the Owner that the caller's work for the partition ended
// (called after Context ended; called before, it releases the partition
// as if the share had moved it). The lease key is then deleted, with its
// revision, so that another replica claims the partition at once.
// Calling it again does nothing.
func (c *Claim) Done() {
	c.once.Do(func() {
		close(c.done)
		c.o.end(c, ErrReleased)
		c.o.wakeUp()
	})
}

// Lose ends the claim at once as lost (cause ErrLeaseLost): the caller
// found the partition someone else's (a write fenced by the claim, such
// as a position commit, found another claim). The fence refuses from now
// on and cuts the POSTs running; Callbacks.Releasing is called; the
// caller still calls Done when its work ended.
func (c *Claim) Lose() { c.o.end(c, ErrLeaseLost) }

// finished reports whether Done was called.
func (c *Claim) finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Owner keeps one replica's partitions: every TTL/4 (on Config.Clock) a
// cycle writes its heartbeat, renews its leases, releases what the share
// no longer gives it and claims what it gives. Start it once; Stop
// releases everything gracefully.
type Owner struct {
	lifecycle.Base

	cfg    Config
	js     jetstream.JetStream
	epochs Epochs
	cb     Callbacks
	log    *slog.Logger
	clock  clockwork.Clock

	kv   jetstream.KeyValue // the lease bucket, opened by Start
	ttl  time.Duration      // its TTL (LeaseTTL)
	view *MemberView
	warn *WarnPace

	wake chan struct{} // a claim was Done: the next cycle at once

	mu     sync.Mutex
	claims map[int]*Claim // held, ending or lost and not yet Done
}

// New returns an Owner of cfg's partitions, or an error naming the field
// of cfg, deps or cb that is wrong. It does no I/O: Start does.
func New(cfg Config, deps Deps, cb Callbacks) (*Owner, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	switch {
	case deps.JetStream == nil:
		return nil, errors.New("owner: Deps.JetStream is nil")
	case deps.Epochs.KV == nil:
		return nil, errors.New("owner: Deps.Epochs.KV is nil")
	case cb.Gained == nil:
		return nil, errors.New("owner: Callbacks.Gained is nil")
	}
	return &Owner{cfg: cfg, js: deps.JetStream, epochs: deps.Epochs, cb: cb, log: cfg.Logger, clock: cfg.Clock,
		warn: NewWarnPace(cfg.Clock), wake: make(chan struct{}, 1), claims: map[int]*Claim{}}, nil
}

// Start opens the lease bucket (creating it when missing) and reads its
// TTL, then runs the Owner in the background until Stop
// (lifecycle.Part): the member view (a Part it starts and stops) and the
// cycles. The first cycle waits for the view's first keys (at most a
// cycle), so that it shares among the members the bucket holds. ctx
// bounds the opening only. Errors: the bucket's. Stop releases every
// partition (cause ErrStopping), waits for their Done (at most
// Config.ReleaseWait), deletes their leases and this replica's
// heartbeat, so that the other replicas take over at once, and returns
// when the Owner and its member view stopped.
func (o *Owner) Start(ctx context.Context) error {
	return o.Base.Start(ctx, o.open, func(ctx context.Context) error {
		if err := o.view.Start(ctx); err != nil {
			return err
		}
		o.run(ctx)
		o.view.Stop()
		return nil
	})
}

// open opens the lease bucket and makes the member view.
func (o *Owner) open(ctx context.Context) error {
	kv, err := Bucket(ctx, o.js, o.bucketConfig())
	if err != nil {
		return err
	}
	ttl, err := LeaseTTL(ctx, kv, o.cfg.LeaseTTL, o.log)
	if err != nil {
		return err
	}
	o.kv, o.ttl = kv, ttl
	o.view = NewMemberView(o.cfg.Archetype, kv, ttl, o.restore)
	return nil
}

// Owned returns the partitions this replica holds and is not releasing,
// sorted.
func (o *Owner) Owned() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ps []int
	for p, c := range o.claims {
		if !c.ending {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// bucketConfig is the lease bucket's configuration.
func (o *Owner) bucketConfig() jetstream.KeyValueConfig {
	return LeaseBucketConfig(o.cfg.Bucket, o.cfg.LeaseTTL, o.cfg.Replicas)
}

// restore creates the lease bucket again when err says it is gone
// (deleted while the replica runs): the handles name their bucket, so
// they work again once it exists.
func (o *Owner) restore(ctx context.Context, err error) {
	if !BucketGone(err) {
		return
	}
	if _, err := Bucket(ctx, o.js, o.bucketConfig()); err != nil {
		o.warn.Warn(o.log, "", "the lease bucket is gone; creating it again failed, retrying at the next cycle", slog.Any("error", err))
		return
	}
	o.log.Warn("the lease bucket was deleted while this replica ran; created it again", slog.String("bucket", o.cfg.Bucket))
}

// wakeUp starts the next cycle at once.
func (o *Owner) wakeUp() {
	select {
	case o.wake <- struct{}{}:
	default: // a cycle is due already
	}
}

// end ends c's context with cause (once: a later cause is ignored) and
// tells the caller (Callbacks.Releasing). ErrLeaseLost also loses the
// fence, which cuts the POSTs running.
func (o *Owner) end(c *Claim, cause error) {
	o.mu.Lock()
	if errors.Is(cause, ErrLeaseLost) {
		c.lost = true
	}
	first := !c.ending
	c.ending = true
	if c.timer != nil {
		c.timer.Stop()
	}
	tell := !c.told && o.cb.Releasing != nil && !c.finished()
	c.told = true
	o.mu.Unlock()
	if errors.Is(cause, ErrLeaseLost) {
		c.Fence.Lose() // before the context: nothing passes the fence from now on
	}
	if !first {
		return
	}
	c.cancel(cause)
	if tell {
		o.cb.Releasing(c)
	}
}

// watchDeadline ends c with ErrLeaseLost once its fence's deadline passes
// without a renewal (on either clock, checked when the injected clock's
// timer fires): a replica whose renewals stopped (a connection cut, a
// bucket leader down) loses its partitions at the deadline, not only
// when it next finds its key taken.
func (o *Owner) watchDeadline(c *Claim) {
	left, _ := c.Fence.Left()
	var check func()
	check = func() {
		o.mu.Lock()
		if c.ending {
			o.mu.Unlock()
			return
		}
		left, held := c.Fence.Left()
		if held {
			c.timer.Reset(left)
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		o.log.Warn("partition lease deadline passed without a renewal; stopping it: nothing more is sent", slog.Int("partition", c.Partition))
		o.end(c, ErrLeaseLost)
	}
	o.mu.Lock()
	c.timer = o.clock.AfterFunc(max(left, 0), check)
	o.mu.Unlock()
}
