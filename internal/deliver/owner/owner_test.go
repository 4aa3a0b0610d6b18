package owner

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/wire"
)

// world is replicas of one deployment on one embedded JetStream server:
// P partitions, one lease bucket, one epoch counter; it records every
// claim's epoch by partition, in claim order.
type world struct {
	t   *testing.T
	srv *embedded.Server
	p   int
	ttl time.Duration

	mu     sync.Mutex
	epochs map[int][]uint64
}

func newWorld(t *testing.T, partitions int, ttl time.Duration) *world {
	t.Helper()
	return &world{t: t, srv: startServer(t), p: partitions, ttl: ttl, epochs: map[int][]uint64{}}
}

// replica is one Owner and what its callbacks were told: the partitions
// it holds (gained, not released) and the claims that ended, with their
// causes. Its caller's work for a partition ends as soon as it is told
// (Releasing calls Done).
type replica struct {
	id    string
	w     *world
	clock *clockwork.FakeClock
	nc    *nats.Conn
	o     *Owner

	mu     sync.Mutex
	held   map[int]*Claim
	ended  []*Claim
	causes []error
}

// start starts replica id on clock, on a connection of its own.
func (w *world) start(id string, clock *clockwork.FakeClock) *replica {
	t := w.t
	t.Helper()
	js, nc := connect(t, w.srv)
	ekv, err := Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "epochs", History: 1})
	require.NoError(t, err)
	r := &replica{id: id, w: w, clock: clock, nc: nc, held: map[int]*Claim{}}
	o, err := New(Config{Archetype: base.New(clock, nil, id), Partitions: w.p, LeaseTTL: w.ttl, ReleaseWait: 5 * time.Second},
		Deps{JetStream: js, Epochs: Epochs{KV: ekv}}, Callbacks{Gained: r.gained, Releasing: r.releasing})
	require.NoError(t, err)
	require.NoError(t, o.Start(t.Context()))
	t.Cleanup(o.Stop)
	r.o = o
	return r
}

func (r *replica) gained(c *Claim) {
	r.w.mu.Lock()
	r.w.epochs[c.Partition] = append(r.w.epochs[c.Partition], c.Epoch)
	r.w.mu.Unlock()
	r.mu.Lock()
	r.held[c.Partition] = c
	r.mu.Unlock()
}

func (r *replica) releasing(c *Claim) {
	r.mu.Lock()
	if r.held[c.Partition] == c {
		delete(r.held, c.Partition)
	}
	r.ended = append(r.ended, c)
	r.causes = append(r.causes, context.Cause(c.Context()))
	r.mu.Unlock()
	go c.Done() // the partition's work ends at once
}

// holds returns the partitions r holds, sorted.
func (r *replica) holds() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []int
	for p := range r.held {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// endedWith returns the claims of r that ended with cause.
func (r *replica) endedWith(cause error) []*Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cs []*Claim
	for i, c := range r.ended {
		if r.causes[i] == cause {
			cs = append(cs, c)
		}
	}
	return cs
}

// owners returns the owner of each partition held by one of rs, failing
// the test (without stopping it) when two hold the same partition at
// once.
func owners(t *testing.T, rs ...*replica) map[int]string {
	t.Helper()
	owner := map[int]string{}
	for _, r := range rs {
		for _, p := range r.holds() {
			if o, dup := owner[p]; dup {
				t.Errorf("partition %d held by %s and %s at once", p, o, r.id) // not Fatalf: called from Eventually's goroutine
			}
			owner[p] = r.id
		}
	}
	return owner
}

// settled reports whether rs hold every partition between them, each
// within one of its share (a quota), and the lease keys in the bucket
// name the same owners.
func (w *world) settled(t *testing.T, kv jetstream.KeyValue, rs ...*replica) bool {
	t.Helper()
	owner := owners(t, rs...)
	if len(owner) != w.p {
		return false
	}
	for _, r := range rs {
		if n := len(r.holds()); n < w.p/len(rs) || n > (w.p+len(rs)-1)/len(rs) {
			return false
		}
		if !slices.Equal(r.holds(), r.o.Owned()) {
			return false
		}
	}
	for p, id := range owner {
		e, err := kv.Get(t.Context(), LeaseKey(p))
		if err != nil || string(e.Value()) != id {
			return false
		}
	}
	return true
}

// epochsGrew checks that every partition's epochs grew at each claim.
func (w *world) epochsGrew(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, es := range w.epochs {
		for i := 1; i < len(es); i++ {
			require.Greater(t, es[i], es[i-1], "partition %d's claims' epochs %v", p, es)
		}
	}
}

// claims returns how many claims partition p had.
func (w *world) claims(p int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.epochs[p])
}

// leaseBucket is a handle on the lease bucket, of a connection of the
// test's own.
func (w *world) leaseBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	js, _ := connect(t, w.srv)
	var kv jetstream.KeyValue
	require.Eventually(t, func() bool {
		var err error
		kv, err = js.KeyValue(t.Context(), wire.DefaultLeaseBucket)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return kv
}

// drive advances clocks by step every 20 ms until cond holds (10 s).
func drive(t *testing.T, step time.Duration, cond func() bool, msg string, clocks ...*clockwork.FakeClock) {
	t.Helper()
	require.Eventually(t, func() bool {
		if cond() {
			return true
		}
		for _, c := range clocks {
			c.Advance(step)
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, msg)
}

// Three replicas share 8 partitions by the rendezvous share: each
// partition has exactly one owner at every moment, each replica two or
// three, and the lease keys say the same; every claim has its own epoch.
func TestReplicasSharePartitionsEachWithOneOwner(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, 10*time.Second)
	clock := clockwork.NewFakeClock()
	a := w.start("a", clock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a) }, "one replica takes every partition", clock)
	b := w.start("b", clock)
	c := w.start("c", clock)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b, c) }, "three replicas share the partitions", clock)
	w.epochsGrew(t)
	require.NotEmpty(t, a.endedWith(ErrReleased), "a gave partitions up to the replicas that joined")
	for _, cl := range a.endedWith(ErrReleased) {
		require.False(t, cl.Fence.MayStart(), "a released partition starts no POST")
	}
}

// A replica taking many partitions in one cycle (all of them at its
// start, as a survivor takes a dead replica's) creates their leases at
// once and takes their epochs with one write of the counter, not one
// each: one claim after the other, eight partitions were 24 round trips,
// past the cycle's half TTL under load.
func TestOneCycleTakesItsClaimsEpochsInOneWrite(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, 10*time.Second)
	clock := clockwork.NewFakeClock()
	a := w.start("a", clock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a) }, "a takes every partition", clock)
	js, _ := connect(t, w.srv)
	ekv, err := js.KeyValue(t.Context(), "epochs")
	require.NoError(t, err)
	e, err := ekv.Get(t.Context(), wire.EpochKey)
	require.NoError(t, err)
	require.Equal(t, uint64(1), e.Revision(), "the eight claims' epochs in one write")
	w.epochsGrew(t)
	got := map[uint64]bool{}
	for p := range w.p {
		require.Equal(t, 1, w.claims(p))
		got[w.epochs[p][0]] = true
	}
	require.Len(t, got, w.p, "each claim its own epoch")
}

// A replica stopped gracefully releases its partitions (their work ends,
// their leases are deleted, its heartbeat too) and the others take them
// over at once, well before the lease TTL (10 s, real time on the
// server) could have expired anything; the new claims' epochs are above
// the old ones.
func TestStoppedReplicaReleasesAndAnotherTakesOverAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, 10*time.Second)
	clock := clockwork.NewFakeClock()
	a, b, c := w.start("a", clock), w.start("b", clock), w.start("c", clock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b, c) }, "three replicas share the partitions", clock)
	moved := c.holds()
	before := map[int]int{}
	for _, p := range moved {
		before[p] = w.claims(p)
	}
	began := time.Now()
	c.o.Stop()
	require.Empty(t, c.holds())
	require.Len(t, c.endedWith(ErrStopping), len(moved), "every partition released with ErrStopping")
	for _, cl := range c.endedWith(ErrStopping) {
		require.False(t, cl.Fence.MayStart())
		if e, err := kv.Get(t.Context(), LeaseKey(cl.Partition)); err == nil {
			require.NotEqual(t, "c", string(e.Value()), "c's lease of %d deleted", cl.Partition)
		}
	}
	_, err := kv.Get(t.Context(), MemberKey("c"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "c's heartbeat deleted")

	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b) }, "a and b take c's partitions", clock)
	require.Less(t, time.Since(began), w.ttl, "taken over before any lease could expire")
	for _, p := range moved {
		require.Greater(t, w.claims(p), before[p], "partition %d claimed again", p)
	}
	w.epochsGrew(t)
}

// A lease found taken on renewal (overwritten here) stops its partition
// at once: the fence refuses new POSTs and a POST running is cut; the
// claim ends with ErrLeaseLost and the lease, someone else's, is left.
func TestPartitionWhoseLeaseIsFoundTakenStopsAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4, 10*time.Second)
	clock := clockwork.NewFakeClock()
	a := w.start("a", clock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a) }, "a takes every partition", clock)
	a.mu.Lock()
	cl := a.held[2]
	a.mu.Unlock()
	post, done, err := cl.Fence.Bound(context.Background())
	require.NoError(t, err)
	defer done()
	_, err = kv.Put(t.Context(), LeaseKey(2), []byte("intruder"))
	require.NoError(t, err)

	drive(t, w.ttl/16, func() bool { return slices.Contains(a.endedWith(ErrLeaseLost), cl) }, "the renewal finds the lease taken", clock)
	require.False(t, cl.Fence.MayStart(), "no POST starts")
	_, _, err = cl.Fence.Bound(context.Background())
	require.ErrorIs(t, err, ErrLeasePassed)
	require.ErrorIs(t, context.Cause(post), ErrLeasePassed, "the POST running is cut")
	require.NotContains(t, a.holds(), 2)
	e, err := kv.Get(t.Context(), LeaseKey(2))
	require.NoError(t, err)
	require.Equal(t, "intruder", string(e.Value()), "the lease taken is not deleted")
}

// A replica whose connection is cut cannot renew: at its lease deadline
// (3/4 TTL after the last renewal's start, on its clock) it loses every
// partition, its fences refuse new POSTs, and once its keys expired on
// the server the others take its partitions with higher epochs.
func TestReplicaCutOffLosesItsPartitionsAtTheDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire on the server (1 s)")
	}
	t.Parallel()
	w := newWorld(t, 6, time.Second)
	clock, cclock := clockwork.NewFakeClock(), clockwork.NewFakeClock()
	a, b, c := w.start("a", clock), w.start("b", clock), w.start("c", cclock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b, c) }, "three replicas share the partitions", clock, cclock)
	lost := c.holds()
	require.NotEmpty(t, lost)
	c.mu.Lock()
	var fences []*Fence
	for _, cl := range c.held {
		fences = append(fences, cl.Fence)
	}
	c.mu.Unlock()

	c.nc.Close()
	deadlines := make([]time.Time, len(fences))
	for i, f := range fences {
		deadlines[i] = fenceDeadline(f) // a renewal under way may still move it later, never earlier
	}
	require.Eventually(t, func() bool {
		for i, f := range fences {
			if fenceLost(f) && cclock.Now().Before(deadlines[i]) {
				t.Errorf("partition lost at %s, before its deadline %s", cclock.Now(), deadlines[i])
			}
		}
		cclock.Advance(w.ttl / 16)
		return len(c.endedWith(ErrLeaseLost)) == len(lost)
	}, 5*time.Second, 10*time.Millisecond, "every partition lost at its deadline")
	for _, f := range fences {
		require.False(t, f.MayStart(), "no POST starts past the deadline")
		_, _, err := f.Bound(context.Background())
		require.ErrorIs(t, err, ErrLeasePassed)
	}

	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b) }, "a and b take c's partitions once its leases expired", clock)
	w.epochsGrew(t)
}

// A replica frozen (its clock stands still, nothing of it runs) past its
// lease: the others take its partitions once its keys expired; when it
// wakes, its lease deadlines have passed, so it loses every partition at
// once and its fences refuse new POSTs; then the three share again, one
// owner a partition, the epochs having grown at every claim.
func TestFrozenReplicaLosesItsPartitionsAndTheOthersTakeOver(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire on the server (1 s)")
	}
	t.Parallel()
	w := newWorld(t, 6, time.Second)
	clock, cclock := clockwork.NewFakeClock(), clockwork.NewFakeClock()
	a, b, c := w.start("a", clock), w.start("b", clock), w.start("c", cclock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b, c) }, "three replicas share the partitions", clock, cclock)
	frozen := c.holds()
	c.mu.Lock()
	var fences []*Fence
	for _, cl := range c.held {
		fences = append(fences, cl.Fence)
	}
	c.mu.Unlock()

	// c frozen: only a and b's clock moves.
	drive(t, w.ttl/16, func() bool { return len(owners(t, a, b)) == w.p }, "a and b take c's partitions once its leases expired", clock)
	w.epochsGrew(t)

	cclock.Advance(w.ttl) // c wakes up
	require.Eventually(t, func() bool { return len(c.endedWith(ErrLeaseLost)) == len(frozen) }, 5*time.Second, 10*time.Millisecond,
		"c loses every partition on waking")
	for _, f := range fences {
		require.False(t, f.MayStart(), "no POST starts after the wake")
	}
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a, b, c) }, "the three share again", clock, cclock)
	w.epochsGrew(t)
}

// New refuses a configuration with a clear error naming the field.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	kv, err := Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "epochs"})
	require.NoError(t, err)
	deps, cb := Deps{JetStream: js, Epochs: Epochs{KV: kv}}, Callbacks{Gained: func(*Claim) {}}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Archetype: base.New(nil, nil, "a.b"), Partitions: 16}, `Config.Replica "a.b"`},
		{Config{Archetype: base.New(nil, nil, "a")}, "Config.Partitions 0"},
		{Config{Archetype: base.New(nil, nil, "a"), Partitions: 2000}, "Config.Partitions 2000"},
		{Config{Archetype: base.New(nil, nil, "a"), Partitions: 16, LeaseTTL: time.Millisecond}, "Config.LeaseTTL 1ms"},
		{Config{Archetype: base.New(nil, nil, "a"), Partitions: 16, ReleaseWait: -time.Second}, "Config.ReleaseWait -1s"},
	} {
		_, err := New(tc.cfg, deps, cb)
		require.ErrorContains(t, err, tc.want)
	}
	o, err := New(Config{Partitions: 16}, deps, cb)
	require.NoError(t, err)
	require.True(t, base.ValidReplica(o.cfg.Replica), "a default replica id: %q", o.cfg.Replica)
	_, err = New(Config{Archetype: base.New(nil, nil, "a"), Partitions: 16}, Deps{JetStream: js}, cb)
	require.ErrorContains(t, err, "Deps.Epochs.KV")
	_, err = New(Config{Archetype: base.New(nil, nil, "a"), Partitions: 16}, deps, Callbacks{})
	require.ErrorContains(t, err, "Callbacks.Gained")
}

// A claim the caller finds lost (a fenced write found another claim)
// ends at once: Releasing with ErrLeaseLost, the fence refusing; once
// Done, the partition is claimed again with a higher epoch.
func TestClaimLostByItsCallerEndsAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2, 10*time.Second)
	clock := clockwork.NewFakeClock()
	a := w.start("a", clock)
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, a) }, "a takes every partition", clock)
	a.mu.Lock()
	cl := a.held[1]
	a.mu.Unlock()
	cl.Lose()
	require.Len(t, a.endedWith(ErrLeaseLost), 1)
	require.False(t, cl.Fence.MayStart())
	drive(t, w.ttl/16, func() bool { return w.claims(1) == 2 && w.settled(t, kv, a) }, "partition 1 claimed again", clock)
	w.epochsGrew(t)
}

// Replicas stopped all at once, while the others may still claim what
// each releases, all stop, and leave the lease bucket with no lease and
// no heartbeat of theirs.
func TestOwnersStoppedTogetherLeaveNoLease(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, 10*time.Second)
	clock := clockwork.NewFakeClock()
	rs := []*replica{w.start("a", clock), w.start("b", clock), w.start("c", clock)}
	kv := w.leaseBucket(t)
	drive(t, w.ttl/16, func() bool { return w.settled(t, kv, rs...) }, "three replicas share the partitions", clock)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(r.o.Stop)
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	drive(t, w.ttl/16, func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}, "every replica stopped", clock)
	keys, err := kv.ListKeys(t.Context())
	require.NoError(t, err)
	var left []string
	for k := range keys.Keys() {
		left = append(left, k)
	}
	require.Empty(t, left, "no lease and no heartbeat left")
	w.epochsGrew(t)
}
