package owner

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// run runs a cycle every TTL/4, from the start of the last (timed from
// its end, a slow cycle would leave the next renewals past the deadlines
// the last one set), or at once when a claim is Done, until ctx ends;
// then it releases everything (shutdown).
func (o *Owner) run(ctx context.Context) {
	every := o.ttl / 4
	// The first cycle shares from the members the bucket holds: the
	// view's first keys (a cycle at most), not an empty view.
	o.view.WaitLoaded(ctx, every)
	for ctx.Err() == nil {
		began := o.clock.Now()
		o.cycle(false)
		t := o.clock.NewTimer(max(every-o.clock.Since(began), 0))
		select {
		case <-ctx.Done():
		case <-t.Chan():
		case <-o.wake:
		}
		t.Stop()
	}
	o.shutdown(every)
}

// shutdown releases every claim (ErrStopping) and keeps renewing their
// leases while their work ends, deleting each lease once its claim is
// Done, until none is left or Config.ReleaseWait passed (the rest
// expire); then it deletes this replica's heartbeat, so that the other
// replicas share without it at once.
func (o *Owner) shutdown(every time.Duration) {
	releaseBy := o.clock.Now().Add(o.cfg.ReleaseWait)
	for {
		began := o.clock.Now()
		o.cycle(true)
		o.mu.Lock()
		left := len(o.claims)
		o.mu.Unlock()
		wait := o.clock.Until(releaseBy)
		if left == 0 {
			break
		}
		if wait <= 0 {
			o.log.Warn("partitions released at shutdown did not end in time; their leases expire", slog.Int("partitions", left),
				slog.Duration("release_wait", o.cfg.ReleaseWait))
			break
		}
		t := o.clock.NewTimer(min(max(every-o.clock.Since(began), 0), wait))
		select {
		case <-t.Chan():
		case <-o.wake:
		}
		t.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.ttl/2)
	defer cancel()
	if err := o.kv.Delete(ctx, MemberKey(o.cfg.Replica)); err != nil {
		o.log.Debug("deleting the membership heartbeat failed; it expires", slog.Any("error", err))
	}
}

// cycle deletes the leases of the claims that are Done, heartbeats and
// renews every lease it holds (at once, in parallel: one after the other
// under load, the last renewals came after the deadlines the last cycle
// set), then releases what the share no longer gives this replica and
// claims what it gives. Stopping, it heartbeats and claims nothing and
// releases everything. Its I/O is bounded by half the lease TTL on the
// wall clock.
func (o *Owner) cycle(stopping bool) {
	ctx, cancel := context.WithTimeout(context.Background(), o.ttl/2)
	defer cancel()
	start := o.clock.Now()
	o.deleteFinished(ctx)
	var beat error
	var wg sync.WaitGroup
	if !stopping {
		wg.Go(func() { beat = o.heartbeat(ctx) })
	}
	wg.Go(func() { o.renewAll(ctx, start) })
	wg.Wait()
	if beat != nil {
		o.warn.Warn(o.log, "", "membership heartbeat failed", slog.Any("error", beat))
		o.restore(ctx, beat)
	}
	if stopping {
		o.mu.Lock()
		var all []*Claim
		for _, c := range o.claims {
			all = append(all, c)
		}
		o.mu.Unlock()
		for _, c := range all {
			o.end(c, ErrStopping)
		}
		return
	}
	self := o.cfg.Replica
	members, err := o.view.Members(self)
	if err != nil {
		o.warn.Warn(o.log, "", "the lease bucket's members are not known yet; keeping the current partitions, claiming none", slog.Any("error", err))
		return
	}
	owned := o.Owned()
	var taken map[int]bool
	if len(owned) < Quota(o.cfg.Partitions, members, self) {
		if taken, err = o.view.Leases(); err != nil {
			return
		}
	}
	_, release, claim := Share(o.cfg.Partitions, members, self, owned, taken)
	for _, p := range release {
		o.mu.Lock()
		c := o.claims[p]
		o.mu.Unlock()
		o.log.Info("releasing partition: another replica's share now", slog.Int("partition", p))
		o.end(c, ErrReleased)
	}
	if err := ctx.Err(); err != nil {
		o.log.Warn("lease renewals took longer than half the lease TTL; claims wait for the next round", slog.Duration("lease_ttl", o.ttl))
		return
	}
	var todo []int
	o.mu.Lock()
	for _, p := range claim {
		if _, ending := o.claims[p]; !ending { // lost here, its work not ended yet
			todo = append(todo, p)
		}
	}
	o.mu.Unlock()
	o.claimAll(ctx, todo, start)
}

// heartbeat writes this replica's membership key, and tells the view.
func (o *Owner) heartbeat(ctx context.Context) error {
	key := MemberKey(o.cfg.Replica)
	o.view.Check(key) // the last cycle's heartbeat came through the watch
	rev, err := o.kv.Put(ctx, key, []byte(o.cfg.Replica))
	if err == nil {
		o.view.Wrote(key, rev)
	}
	return err
}

// renewAll renews the lease of every claim not lost and not Done (a
// released one keeps its lease until its work ended), all at once: a
// renewed lease's deadline moves to start plus 3/4 TTL; one found taken
// ends its claim with ErrLeaseLost at once.
func (o *Owner) renewAll(ctx context.Context, start time.Time) {
	type renewal struct {
		c        *Claim
		rev, got uint64
		err      error
	}
	o.mu.Lock()
	var rs []*renewal
	for _, c := range o.claims {
		if !c.lost && !c.finished() {
			rs = append(rs, &renewal{c: c, rev: c.rev})
		}
	}
	o.mu.Unlock()
	self := []byte(o.cfg.Replica)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { r.got, r.err = o.kv.Update(ctx, LeaseKey(r.c.Partition), self, r.rev) })
	}
	wg.Wait()
	deadline := start.Add(o.ttl - o.ttl/4)
	for _, r := range rs {
		switch {
		case r.err == nil:
			o.mu.Lock()
			r.c.rev = r.got
			o.mu.Unlock()
			r.c.Fence.SetDeadline(deadline)
		case RevisionLost(r.err):
			o.log.Warn("partition lease lost (expired or taken); stopping it: nothing more is sent", slog.Int("partition", r.c.Partition), slog.Any("error", r.err))
			o.end(r.c, ErrLeaseLost)
		default:
			o.warn.Warn(o.log, "", "renewing a partition lease failed", slog.Int("partition", r.c.Partition), slog.Any("error", r.err))
			o.restore(ctx, r.err)
		}
	}
}

// deleteFinished deletes the lease of every claim that is Done, at the
// revision it last wrote (a lease taken since is left alone), and forgets
// the claim.
func (o *Owner) deleteFinished(ctx context.Context) {
	o.mu.Lock()
	var done []*Claim
	for p, c := range o.claims {
		if c.finished() {
			done = append(done, c)
			delete(o.claims, p)
		}
	}
	o.mu.Unlock()
	for _, c := range done {
		o.mu.Lock()
		rev := c.rev
		o.mu.Unlock()
		if err := o.kv.Delete(ctx, LeaseKey(c.Partition), jetstream.LastRevision(rev)); err != nil {
			o.log.Debug("deleting a released lease failed; it expires", slog.Int("partition", c.Partition), slog.Any("error", err))
		}
	}
}

// claimAll creates the lease keys of partitions ps, all at once (one
// after the other, a dead replica's eight partitions took eight round
// trips and, under load, more than the cycle's time), takes the epochs of
// those created with one write of the counter (Epochs.NextFor) and tells
// the caller of each (Callbacks.Gained). A key that exists is another
// replica's (the view was late, or the server has not expired it yet):
// that partition is not claimed. Epochs that cannot be taken delete the
// leases again.
func (o *Owner) claimAll(ctx context.Context, ps []int, start time.Time) {
	revs := make([]uint64, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { revs[i], errs[i] = o.kv.Create(ctx, LeaseKey(p), []byte(o.cfg.Replica)) })
	}
	wg.Wait()
	var created []int
	var createdRevs []uint64
	for i, p := range ps {
		switch err := errs[i]; {
		case err == nil:
			created, createdRevs = append(created, p), append(createdRevs, revs[i])
		case !errors.Is(err, jetstream.ErrKeyExists):
			o.warn.Warn(o.log, "", "claiming a partition lease failed", slog.Int("partition", p), slog.Any("error", err))
			o.restore(ctx, err)
		}
	}
	if len(created) == 0 {
		return
	}
	epochs, err := o.epochs.NextFor(ctx, createdRevs)
	if err != nil {
		o.warn.Warn(o.log, "", "giving claimed partitions their lease epochs failed; releasing the leases", slog.Any("partitions", created), slog.Any("error", err))
		for i, p := range created {
			if err := o.kv.Delete(ctx, LeaseKey(p), jetstream.LastRevision(createdRevs[i])); err != nil {
				o.log.Debug("deleting an unused lease failed; it expires", slog.Int("partition", p), slog.Any("error", err))
			}
		}
		return
	}
	for i, p := range created {
		o.gain(p, epochs[i], createdRevs[i], start)
	}
}

// gain records the claim of partition p (its lease created at revision
// rev, its epoch taken) and tells the caller (Callbacks.Gained).
func (o *Owner) gain(p int, epoch, rev uint64, start time.Time) {
	cctx, cancel := context.WithCancelCause(context.Background())
	c := &Claim{Partition: p, Epoch: epoch, Fence: NewFence(cctx, o.clock, start.Add(o.ttl-o.ttl/4)),
		cancel: cancel, done: make(chan struct{}), o: o, rev: rev}
	o.mu.Lock()
	o.claims[p] = c
	o.mu.Unlock()
	o.log.Info("partition taken", slog.Int("partition", p), slog.Uint64("epoch", epoch))
	o.cb.Gained(c)
	o.watchDeadline(c)
}
