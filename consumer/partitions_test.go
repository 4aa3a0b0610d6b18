package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/mark"
)

// Replicas hashing streams into different partition counts would
// deliver one stream from two partitions at once: the positions
// bucket's "partitions" key, written by the first replica (or by
// `consumer migrate`), refuses every other count at once, naming the
// flag, both counts and the fix; the same count runs.
func TestSharedEngineRefusesAnotherPartitionCount(t *testing.T) {
	t.Parallel()
	rc := newOrderReceiver(t)
	replica := func(t *testing.T, b bundle, id string, partitions int) *consumer.Consumer {
		c, err := consumer.New(b.js, consumer.Config{Partitions: partitions, LeaseTTL: 2 * time.Second, ReplicaID: id,
			Subscriptions: []consumer.Subscription{sharedSub("ordered", rc.srv.URL, consumer.OrderingStream)}})
		require.NoError(t, err)
		return c
	}
	stored := func(t *testing.T, b bundle) string {
		kv, err := b.js.KeyValue(b.ctx, position.DefaultBucket)
		require.NoError(t, err)
		e, err := kv.Get(b.ctx, mark.PartitionsKey)
		require.NoError(t, err)
		return string(e.Value())
	}

	t.Run("another count refused, the same runs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.createEvents(t)
		a := replica(t, b, "replica-a", 4)
		require.NoError(t, a.Start(b.ctx))
		t.Cleanup(func() { _ = a.Stop(context.Background()) })
		require.Equal(t, "4", stored(t, b), "the first replica writes its count")

		err := replica(t, b, "replica-b", 8).Start(b.ctx)
		require.ErrorIs(t, err, consumer.ErrPartitionsChanged)
		require.ErrorContains(t, err, "--partitions (Config.Partitions) is 8")
		require.ErrorContains(t, err, `"partitions" = 4`)
		require.ErrorContains(t, err, "start every replica with --partitions 4")
		require.NoError(t, b.ctx.Err(), "refused at once, not waited for")

		c := replica(t, b, "replica-c", 4)
		require.NoError(t, c.Start(b.ctx))
		t.Cleanup(func() { _ = c.Stop(context.Background()) })
		const n = 40
		b.publishN(t, 0, n, 8)
		require.Eventually(t, func() bool { return rc.received("/ordered") == n }, 30*time.Second, 10*time.Millisecond,
			"two replicas of the same count deliver every event")
		require.Empty(t, rc.inOrder("/ordered"))
	})

	t.Run("two first replicas", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.createEvents(t)
		cs := []*consumer.Consumer{replica(t, b, "replica-a", 4), replica(t, b, "replica-b", 8)}
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = c.Provision(b.ctx) }()
		}
		wg.Wait()
		refused := 0
		for _, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, consumer.ErrPartitionsChanged)
				refused++
			}
		}
		require.Equal(t, 1, refused, "one wrote the count, the other read it back: %v", errs)
	})

	t.Run("migrate's count honoured", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.createEvents(t)
		kv, err := position.Bucket(b.ctx, b.js, "", 1)
		require.NoError(t, err)
		_, err = kv.Create(b.ctx, mark.PartitionsKey, []byte("8"))
		require.NoError(t, err)

		err = replica(t, b, "replica-a", consumer.DefaultPartitions).Provision(b.ctx)
		require.ErrorIs(t, err, consumer.ErrPartitionsChanged)
		require.ErrorContains(t, err, "--partitions 8")
		require.NoError(t, replica(t, b, "replica-b", 8).Provision(b.ctx))
	})

	t.Run("a larger count's records without the key", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.createEvents(t)
		// The shared engine of an earlier release ran 16 partitions and
		// wrote no key.
		kv, err := position.Bucket(b.ctx, b.js, "", 1)
		require.NoError(t, err)
		_, err = kv.Put(b.ctx, position.Key(15), []byte("x"))
		require.NoError(t, err)

		err = replica(t, b, "replica-a", 8).Provision(b.ctx)
		require.ErrorIs(t, err, consumer.ErrPartitionsChanged)
		require.ErrorContains(t, err, "pos.p15")
		require.ErrorContains(t, err, "--partitions <the count it ran with, at least 16>")
		_, err = kv.Get(b.ctx, mark.PartitionsKey)
		require.Error(t, err, "nothing written on a refusal")
		require.NoError(t, replica(t, b, "replica-b", 16).Provision(b.ctx))
		require.Equal(t, "16", stored(t, b))
	})
}
