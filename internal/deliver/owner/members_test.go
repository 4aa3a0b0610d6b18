package owner

import (
	"context"
	"net/url"
	"slices"
	"strconv"
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

// leaseBucketConfig is the lease bucket of the member view's tests.
func leaseBucketConfig(ttl time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: wire.DefaultLeaseBucket, TTL: ttl, History: 1, Storage: jetstream.FileStorage}
}

// startMemberView runs a member view of kv on clock until the test ends
// and waits for its first keys.
func startMemberView(t *testing.T, kv jetstream.KeyValue, ttl time.Duration, clock clockwork.Clock, failed func(context.Context, error)) *MemberView {
	t.Helper()
	lv := NewMemberView(base.New(clock, nil, ""), kv, ttl, failed)
	require.NoError(t, lv.Start(context.Background()))
	t.Cleanup(lv.Stop)
	select {
	case <-lv.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("the member view did not load the bucket's keys")
	}
	return lv
}

// viewIs reports whether lv's members, for replica self, are members.
func viewIs(lv *MemberView, self string, members ...string) bool {
	m, err := lv.Members(self)
	return err == nil && slices.Equal(m, members)
}

// The member view follows the bucket's member keys from one watch: the
// keys there when it starts, a member that appears, one that leaves
// (SIGTERM deletes its key) and one that dies (its key expires after the
// TTL: nothing comes through the watch, the view drops it by the
// server's time it estimates, moved here by the fake clock); lease keys
// and the old engine's per-subscription member keys are not members.
func TestMemberViewFollowsMembers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := startJetStream(t)
	const ttl = time.Minute
	kv, err := js.CreateKeyValue(ctx, leaseBucketConfig(ttl))
	require.NoError(t, err)
	put := func(key string) {
		t.Helper()
		_, err := kv.Put(ctx, key, []byte("x"))
		require.NoError(t, err)
	}
	put(MemberKey("r1"))
	put(LeaseKey(0))
	put("member.other.r9") // the old engine's
	clock := clockwork.NewFakeClock()
	mv := startMemberView(t, kv, ttl, clock, func(context.Context, error) {})
	require.True(t, viewIs(mv, "self", "r1", "self"), "the keys there before the watch")

	put(MemberKey("r2"))
	require.Eventually(t, func() bool { return viewIs(mv, "self", "r1", "r2", "self") },
		5*time.Second, 5*time.Millisecond, "a member that appears")
	require.NoError(t, kv.Delete(ctx, MemberKey("r2")))
	require.Eventually(t, func() bool { return viewIs(mv, "self", "r1", "self") },
		5*time.Second, 5*time.Millisecond, "a member that leaves")

	clock.Advance(ttl / 2)
	require.True(t, viewIs(mv, "self", "r1", "self"), "a member lives until its TTL")
	clock.Advance(ttl / 2)
	require.True(t, viewIs(mv, "self", "self"), "a member not heard of for a TTL has expired")

	put(MemberKey("r1"))
	require.Eventually(t, func() bool { return viewIs(mv, "self", "r1", "self") },
		5*time.Second, 5*time.Millisecond, "a member that heartbeats again after its expiry")
}

// A view that has not sent every key yet says so: a cycle then claims and
// releases nothing (share's unknown membership).
func TestMemberViewIsNotReadyBeforeItsFirstKeys(t *testing.T) {
	t.Parallel()
	mv := NewMemberView(base.New(clockwork.NewFakeClock(), nil, ""), nil, time.Minute, nil)
	_, err := mv.Members("self")
	require.ErrorIs(t, err, ErrViewNotReady)
	_, err = mv.Leases()
	require.ErrorIs(t, err, ErrViewNotReady)
}

// This replica's own heartbeat must come through the watch within a
// cycle: a view that missed a key's writes twice in a row asks for a new
// watch, once; one that saw it starts counting again.
func TestMemberViewCheckRestartsAWatchThatMissedTwoOwnWrites(t *testing.T) {
	t.Parallel()
	mv := NewMemberView(base.New(clockwork.NewFakeClock(), nil, ""), nil, time.Minute, nil)
	mv.ready = true
	key := MemberKey("self")
	restarts := func() int {
		select {
		case <-mv.restart:
			return 1
		default:
			return 0
		}
	}
	seen := func(rev uint64) {
		mv.mu.Lock()
		mv.applyLocked(mv.members, mv.leases, fakeEntry{key: key, rev: rev, at: time.Now()})
		mv.mu.Unlock()
	}
	mv.Wrote(key, 1)
	seen(1)
	mv.Check(key)
	require.Zero(t, restarts(), "the write came through")
	mv.Wrote(key, 2)
	mv.Check(key)
	require.Zero(t, restarts(), "one cycle late is not stale yet")
	seen(2)
	mv.Wrote(key, 3)
	seen(3)
	mv.Check(key)
	mv.Wrote(key, 4)
	mv.Check(key)
	mv.Wrote(key, 5)
	mv.Check(key)
	require.Equal(t, 1, restarts(), "two writes in a row missing: a new watch")
	mv.Check(key)
	require.Zero(t, restarts(), "a check without a write since says nothing")
}

// fakeEntry is a key-value entry as a watch brings it.
type fakeEntry struct {
	jetstream.KeyValueEntry
	key string
	rev uint64
	at  time.Time
	op  jetstream.KeyValueOp
}

func (e fakeEntry) Key() string                     { return e.key }
func (e fakeEntry) Revision() uint64                { return e.rev }
func (e fakeEntry) Created() time.Time              { return e.at }
func (e fakeEntry) Operation() jetstream.KeyValueOp { return e.op }

// The server is lost with its store (a new empty server on the same
// address): the lease bucket is gone. The view's watch ends or resumes
// past the new bucket's end; either way the view is rebuilt from the
// bucket made again (as Owner.restore does), and it misses nothing
// written there: the old members are gone from it, the new ones in it.
func TestMemberViewIsRebuiltAfterTheServersLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a JetStream server and waits for the client to reconnect")
	}
	t.Parallel()
	ctx := t.Context()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	u, err := url.Parse(srv.ClientURL())
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	nc, err := srv.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	const ttl = time.Hour
	kv, err := js.CreateKeyValue(ctx, leaseBucketConfig(ttl))
	require.NoError(t, err)
	for i := range 20 { // the old bucket's sequences run past the new one's
		_, err = kv.Put(ctx, MemberKey("r1"), []byte("r1"))
		require.NoError(t, err, "put %d", i)
	}
	clock := clockwork.NewFakeClock()
	restore := func(ctx context.Context, err error) {
		if BucketGone(err) {
			_, _ = Bucket(ctx, js, leaseBucketConfig(ttl))
		}
	}
	mv := startMemberView(t, kv, ttl, clock, restore)
	require.True(t, viewIs(mv, "self", "r1", "self"))

	srv.Shutdown()
	srv2, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: port})
	require.NoError(t, err)
	t.Cleanup(srv2.Shutdown)
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)

	// What a cycle does: heartbeat (the bucket made again
	// when gone), tell the view, and check it at the next cycle; the
	// fake clock paces the view's retries.
	self := MemberKey("self")
	require.Eventually(t, func() bool {
		mv.Check(self)
		if _, err := Bucket(ctx, js, leaseBucketConfig(ttl)); err != nil {
			return false
		}
		if _, err := kv.Put(ctx, MemberKey("r3"), []byte("r3")); err != nil {
			return false
		}
		rev, err := kv.Put(ctx, self, []byte("self"))
		if err != nil {
			return false
		}
		mv.Wrote(self, rev)
		clock.Advance(time.Second)
		return viewIs(mv, "self", "r3", "self")
	}, 60*time.Second, 100*time.Millisecond, "the view rebuilt from the new bucket: r1 gone, r3 there")

	require.NoError(t, kv.Delete(ctx, MemberKey("r3")))
	require.Eventually(t, func() bool { return viewIs(mv, "self", "self") },
		5*time.Second, 5*time.Millisecond, "the rebuilt view follows the bucket")
}

// One heartbeat per replica and the partition leases, from one watch; the old engine's keys in the same bucket are
// neither. A lease key leaves the view when deleted, or when the server's
// time it estimates passes its last write plus the TTL.
func TestMemberViewFollowsReplicasAndPartitionLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := startJetStream(t)
	const ttl = time.Minute
	kv, err := js.CreateKeyValue(ctx, leaseBucketConfig(ttl))
	require.NoError(t, err)
	put := func(key string) {
		t.Helper()
		_, err := kv.Put(ctx, key, []byte("x"))
		require.NoError(t, err)
	}
	put(MemberKey("r1"))
	put(LeaseKey(3))
	put("member.s.r9") // the old engine's
	put("lease.s.4")
	clock := clockwork.NewFakeClock()
	mv := NewMemberView(base.New(clock, nil, ""), kv, ttl, nil)
	require.NoError(t, mv.Start(ctx))
	t.Cleanup(mv.Stop)
	mv.WaitLoaded(ctx, time.Hour)
	leasesAre := func(ps ...int) bool {
		taken, err := mv.Leases()
		if err != nil || len(taken) != len(ps) {
			return false
		}
		for _, p := range ps {
			if !taken[p] {
				return false
			}
		}
		return true
	}
	members, err := mv.Members("self")
	require.NoError(t, err)
	require.Equal(t, []string{"r1", "self"}, members)
	require.True(t, leasesAre(3))

	put(LeaseKey(7))
	require.Eventually(t, func() bool { return leasesAre(3, 7) }, 5*time.Second, 5*time.Millisecond, "a lease that appears")
	require.NoError(t, kv.Delete(ctx, LeaseKey(3)))
	require.Eventually(t, func() bool { return leasesAre(7) }, 5*time.Second, 5*time.Millisecond, "a lease released")
	clock.Advance(ttl)
	require.True(t, leasesAre(), "a lease not renewed for a TTL has expired")
	members, err = mv.Members("self")
	require.NoError(t, err)
	require.Equal(t, []string{"self"}, members)
}

// The lease bucket's keys read back, and nothing else reads as them.
func TestKeysReadBack(t *testing.T) {
	t.Parallel()
	p, ok := ParseLeaseKey(LeaseKey(12))
	require.True(t, ok)
	require.Equal(t, 12, p)
	r, ok := ParseMemberKey(MemberKey("replica-a"))
	require.True(t, ok)
	require.Equal(t, "replica-a", r)
	for _, k := range []string{"lease.s.3", "lease.p", "lease.p-1", "lease.p03", "lease-epoch", "lease.p3.1"} {
		_, ok := ParseLeaseKey(k)
		require.False(t, ok, k)
	}
	for _, k := range []string{"member.s.r1", "member.", "lease.p1"} {
		_, ok := ParseMemberKey(k)
		require.False(t, ok, k)
	}
}

// A view started again after Stop loads the bucket's keys again (its
// first load is not announced twice: Loaded was closed twice, a panic).
func TestMemberViewStartsAgainAfterStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := startJetStream(t)
	kv, err := js.CreateKeyValue(ctx, leaseBucketConfig(time.Minute))
	require.NoError(t, err)
	_, err = kv.Put(ctx, MemberKey("r1"), []byte("x"))
	require.NoError(t, err)
	mv := NewMemberView(base.New(clockwork.NewFakeClock(), nil, ""), kv, time.Minute, nil)
	for range 2 {
		require.NoError(t, mv.Start(ctx))
		require.Eventually(t, func() bool { return viewIs(mv, "r1", "r1") }, 10*time.Second, 5*time.Millisecond)
		mv.Stop()
	}
}
