package deliver_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// The documented way to change the lease TTL is to stop every replica and
// delete the lease bucket. The bucket the consumer creates again must give
// higher epochs than the deleted one did, or a receiver behind an order
// gate refuses every stream as stale-epoch from then on (the bucket's
// revisions used to start again from 1).
func TestLeaseBucketDeletedAndCreatedAgainKeepsGatedStreamsFlowing(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	var mu sync.Mutex
	done := map[string][]int64{}
	epochs := map[string]uint64{} // the highest epoch seen per partition
	stale := 0                    // requests the gate refused as stale-epoch
	h := webhook.Handler(v, webhook.NewMemoryStore(1<<10), time.Hour, func(_ context.Context, r *http.Request, _ []byte) error {
		e := b.event(r.Header.Get(wire.HeaderIdempotencyKey))
		mu.Lock()
		done[e.stream] = append(done[e.stream], e.version)
		mu.Unlock()
		return nil
	}, webhook.WithOrderGate(webhook.NewOrderGate(webhook.NewMemoryOrderStore())), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, err := strconv.ParseUint(r.Header.Get(wire.HeaderLeaseEpoch), 10, 64)
		if err == nil {
			mu.Lock()
			epochs[r.Header.Get(wire.HeaderPartition)] = max(epochs[r.Header.Get(wire.HeaderPartition)], ep)
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
		if w.Header().Get(wire.HeaderOrder) == "stale-epoch" {
			mu.Lock()
			stale++
			mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	processed := func(n int) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range []string{"order-a", "order-b", "order-c"} {
			if len(done[s]) < n {
				return false
			}
		}
		return true
	}
	run := func() (stop func()) {
		c, err := deliver.New(b.js, deliver.Config{Partitions: 2, LeaseTTL: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))}, orderedSub("gated", srv.URL))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(b.ctx)
		ran := make(chan error, 1)
		go func() { ran <- c.Run(ctx) }()
		return func() {
			cancel()
			select {
			case err := <-ran:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
		}
	}

	stop := run()
	for _, s := range []string{"order-a", "order-b", "order-c"} {
		b.publishStream(t, s, 0, 3)
	}
	require.Eventually(t, func() bool { return processed(3) }, 20*time.Second, 10*time.Millisecond)
	stop()
	// A second run whose leases are created far above the first revisions,
	// as a long-lived bucket's are (renewals and heartbeats are revisions
	// too): a refused replica's leases are created again and again, and
	// must not catch up with the old epochs within the test by doing so.
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultLeaseBucket)
	require.NoError(t, err)
	for i := 0; i < 2000; i++ {
		_, err := kv.Put(b.ctx, "filler", nil)
		require.NoError(t, err)
	}
	mu.Lock()
	epochs = map[string]uint64{}
	mu.Unlock()
	stop = run()
	for _, s := range []string{"order-a", "order-b", "order-c"} {
		b.publishStream(t, s, 3, 4)
	}
	require.Eventually(t, func() bool { return processed(4) }, 20*time.Second, 10*time.Millisecond)
	stop()
	mu.Lock()
	before := epochs
	epochs = map[string]uint64{}
	mu.Unlock()
	require.NotEmpty(t, before)

	require.NoError(t, b.js.DeleteKeyValue(b.ctx, wire.DefaultLeaseBucket))
	stop = run()
	t.Cleanup(stop)
	for _, s := range []string{"order-a", "order-b", "order-c"} {
		b.publishStream(t, s, 4, 6)
	}
	require.Eventually(t, func() bool { return processed(6) }, 20*time.Second, 10*time.Millisecond,
		"the gate must process the events sent under the new bucket's leases")
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, stale, "requests refused as stale-epoch")
	for _, s := range []string{"order-a", "order-b", "order-c"} {
		require.Equal(t, []int64{0, 1, 2, 3, 4, 5}, done[s], "stream %s processed in order, each once", s)
	}
	require.Len(t, epochs, len(before))
	for p, ep := range epochs {
		require.Greater(t, ep, before[p], "partition %s: the new bucket's epoch is above the deleted one's", p)
	}
}

// The lease and park buckets deleted while a replica runs (an operator's
// mistake, or a JetStream store lost) are created again by the replica:
// delivery goes on, in order, instead of retrying on "stream not found"
// for ever.
func TestOrderedDeliveryGoesOnAfterItsBucketsAreDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusNoContent })
	b.runOrdered(t, deliver.Config{Partitions: 2, LeaseTTL: 2 * time.Second}, orderedSub("gone", rc.URL))
	streams := []string{"order-a", "order-b"}
	for _, s := range streams {
		b.publishStream(t, s, 0, 3)
	}
	require.Eventually(t, func() bool { acc := rc.accepted(); return len(acc["order-a"]) >= 3 && len(acc["order-b"]) >= 3 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, b.js.DeleteKeyValue(b.ctx, wire.DefaultLeaseBucket))
	require.NoError(t, b.js.DeleteKeyValue(b.ctx, wire.DefaultParkBucket))
	for _, name := range []string{wire.DefaultLeaseBucket, wire.DefaultParkBucket} {
		require.Eventually(t, func() bool {
			_, err := b.js.KeyValue(b.ctx, name)
			return err == nil
		}, 20*time.Second, 50*time.Millisecond, "bucket %s created again", name)
	}
	for _, s := range streams {
		b.publishStream(t, s, 3, 6)
	}
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		return len(acc["order-a"]) >= 6 && len(acc["order-b"]) >= 6
	}, 30*time.Second, 10*time.Millisecond, "delivery goes on after the buckets are deleted")
	requireInOrder(t, rc.accepted(), streams, 6)
}

// A replica shares an ordered subscription's partitions with the members
// its watch of the lease bucket shows, and claims only partitions whose
// lease key nobody holds. Here the test is the other replica ("zz"): it
// heartbeats, so the replica releases half of the partitions; it takes
// those leases and renews them, and the replica leaves them alone; it
// dies (stops writing), and once its keys expire the replica takes every
// partition again.
func TestOrderedReplicaFollowsMembersAndLeavesLeasesTakenElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for lease keys to expire (2 s TTL)")
	}
	t.Parallel()
	b := setupOrdered(t)
	rc := newReceiver(t, status(http.StatusNoContent))
	const name = "shared"
	b.runOrdered(t, deliver.Config{ReplicaID: "r1", Partitions: 4, LeaseTTL: 2 * time.Second}, orderedSub(name, rc.URL))
	var kv jetstream.KeyValue
	require.Eventually(t, func() bool {
		var err error
		kv, err = b.js.KeyValue(b.ctx, wire.DefaultLeaseBucket)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	// read returns each partition's lease holder, and false when the
	// bucket did not answer every read (a loaded machine's timeout is no
	// lease taken).
	read := func() (map[int]string, bool) {
		out := map[int]string{}
		l, err := kv.ListKeysFiltered(b.ctx, wire.SubscriptionLeaseFilter(name))
		if err != nil {
			return nil, false
		}
		defer func() { _ = l.Stop() }()
		for k := range l.Keys() {
			e, err := kv.Get(b.ctx, k)
			if err != nil {
				return nil, false
			}
			_, p, _ := wire.ParseLeaseKey(k)
			out[p] = string(e.Value())
		}
		return out, true
	}
	owners := func() map[int]string { o, _ := read(); return o }
	held := func(o map[int]string, replica string) (ps []int) {
		for p, r := range o {
			if r == replica {
				ps = append(ps, p)
			}
		}
		return ps
	}
	require.Eventually(t, func() bool { return len(held(owners(), "r1")) == 4 }, 10*time.Second, 20*time.Millisecond, "alone, r1 owns every partition")

	// zz joins: its heartbeat, then its leases, renewed every 300 ms.
	var mu sync.Mutex
	revs := map[int]uint64{} // zz's leases and their revisions
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_, _ = kv.Put(b.ctx, wire.MemberKey(name, "zz"), []byte("zz"))
			mu.Lock()
			for p, rev := range revs {
				r, err := kv.Update(b.ctx, wire.LeaseKey(name, p), []byte("zz"), rev)
				if err != nil {
					// An update whose answer timed out may have landed:
					// go on from the key's revision when it is still zz's.
					if e, gerr := kv.Get(b.ctx, wire.LeaseKey(name, p)); gerr == nil && string(e.Value()) == "zz" {
						r, err = e.Revision(), nil
					}
				}
				if err == nil {
					revs[p] = r
				}
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})
	require.Eventually(t, func() bool { return len(held(owners(), "r1")) == 2 }, 10*time.Second, 20*time.Millisecond,
		"with zz a member, r1 keeps its quota of 2 and releases the rest")
	for p := range 4 {
		if rev, err := kv.Create(b.ctx, wire.LeaseKey(name, p), []byte("zz")); err == nil {
			mu.Lock()
			revs[p] = rev
			mu.Unlock()
		}
	}
	mu.Lock()
	require.Len(t, revs, 2, "zz took the two free partitions")
	mu.Unlock()
	require.Never(t, func() bool {
		// On a loaded machine r1's own leases, and zz's (renewed by this
		// test's loop, every 300 ms against a 2 s TTL), may lapse for a
		// moment; r1's deletes are revision-checked. What r1 must never
		// do is hold more than its share or a partition zz took.
		o, ok := read()
		if !ok {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		taken := len(held(o, "r1")) > 2
		for p := range revs {
			taken = taken || o[p] == "r1"
		}
		if taken {
			t.Logf("lease holders by partition: %v", o)
		}
		return taken
	}, 2*time.Second, 50*time.Millisecond, "r1 leaves zz's leases alone")

	// zz dies: its member and lease keys expire after the TTL.
	close(stop)
	wg.Wait()
	require.Eventually(t, func() bool { return len(held(owners(), "r1")) == 4 }, 15*time.Second, 20*time.Millisecond,
		"once zz's keys expired, r1 owns every partition again")
}
