package owner

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/wire"
)

func newLeaseEpochs(t *testing.T) Epochs {
	t.Helper()
	js := startJetStream(t)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	return Epochs{KV: kv}
}

// Claims taking epochs at once, from several replicas, each get their
// own, and a later claim's is above every earlier one's.
func TestLeaseEpochsGrowUnderConcurrentClaims(t *testing.T) {
	t.Parallel()
	le := newLeaseEpochs(t)
	ctx := context.Background()
	first, err := le.Next(ctx, 7)
	require.NoError(t, err)
	require.Equal(t, uint64(7), first, "a missing counter starts at the lease's create revision")

	var mu sync.Mutex
	got := map[uint64]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			e, err := le.Next(ctx, 1)
			require.NoError(t, err)
			mu.Lock()
			got[e] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, got, 8, "every concurrent claim has its own epoch")
	for e := range got {
		require.Greater(t, e, first)
	}
	last, err := le.Next(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, first+9, last, "the counter counts claims; the lease revision is only a floor")
}

// A stale-epoch answer raises the counter above the receiver's epoch (or,
// naming none, to twice the refused one); a raise never lowers it.
func TestLeaseEpochsRaisedAboveARefusal(t *testing.T) {
	t.Parallel()
	le := newLeaseEpochs(t)
	ctx := context.Background()
	e, err := le.Next(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, le.Raise(ctx, RefusedEpochFloor(e, 1_000_000)))
	e, err = le.Next(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(1_000_001), e)
	require.NoError(t, le.Raise(ctx, RefusedEpochFloor(e, 5)), "a lower floor leaves the counter")
	e, err = le.Next(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(1_000_002), e)
	require.NoError(t, le.Raise(ctx, RefusedEpochFloor(e, 0)))
	e, err = le.Next(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(2_000_005), e, "no epoch named: twice the refused one, plus one")
}

// A counter that is not a number is an error naming the key and value,
// not an epoch from nowhere.
func TestLeaseEpochsRefuseACorruptCounter(t *testing.T) {
	t.Parallel()
	le := newLeaseEpochs(t)
	_, err := le.KV.Put(context.Background(), wire.EpochKey, []byte("soon"))
	require.NoError(t, err)
	_, err = le.Next(context.Background(), 1)
	require.ErrorContains(t, err, `"lease-epoch"`)
	require.ErrorContains(t, err, `"soon"`)
}

// TestRefusedEpochFloorNeverWraps: without an epoch named by the receiver
// the floor is twice the refused epoch, and never wraps around to a low
// one for a huge epoch.
func TestRefusedEpochFloorNeverWraps(t *testing.T) {
	t.Parallel()
	require.Equal(t, uint64(7), RefusedEpochFloor(3, 7), "the receiver's epoch when it names one")
	require.Equal(t, uint64(6), RefusedEpochFloor(3, 0))
	require.Equal(t, uint64(1), RefusedEpochFloor(0, 0))
	for _, e := range []uint64{math.MaxUint64 / 3, math.MaxUint64/2 + 1, math.MaxUint64} {
		require.GreaterOrEqual(t, RefusedEpochFloor(e, 0), uint64(math.MaxUint64/2), "epoch %d", e)
	}
}

// Several claims take their epochs with one write of the counter: each
// above the counter and the one before, at least its lease's revision,
// and the counter left at the last.
func TestLeaseEpochsForSeveralClaimsInOneWrite(t *testing.T) {
	t.Parallel()
	le := newLeaseEpochs(t)
	ctx := context.Background()
	first, err := le.Next(ctx, 3)
	require.NoError(t, err)
	es, err := le.NextFor(ctx, []uint64{1, 10, 2})
	require.NoError(t, err)
	require.Equal(t, []uint64{first + 1, 10, 11}, es)
	e, err := le.KV.Get(ctx, wire.EpochKey)
	require.NoError(t, err)
	require.Equal(t, "11", string(e.Value()))
	require.Equal(t, uint64(2), e.Revision(), "one write for the three claims")
	none, err := le.NextFor(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, none)
	next, err := le.Next(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(12), next)
}
