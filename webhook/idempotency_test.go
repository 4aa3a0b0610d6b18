package webhook_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
)

// fakeClock is a settable clock for TTL tests (no sleeping).
type fakeClock struct{ unixNano atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.unixNano.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.unixNano.Add(int64(d)) }

func setupStore(t *testing.T, maxKeys int) (*webhook.MemoryStore, *fakeClock) {
	t.Helper()
	clock := &fakeClock{}
	clock.unixNano.Store(time.Unix(1_700_000_000, 0).UnixNano())
	return webhook.NewMemoryStore(maxKeys, webhook.WithStoreClock(clock.now)), clock
}

func TestMemoryStoreClaimOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, _ := setupStore(t, 10)
	first, err := m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.True(t, first)
	first, err = m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.False(t, first, "second claim of an unexpired key")
	first, err = m.Claim(ctx, "43", time.Minute)
	require.NoError(t, err)
	require.True(t, first, "another key is independent")
}

func TestMemoryStoreTTLExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, clock := setupStore(t, 10)
	first, err := m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.True(t, first)

	clock.advance(time.Minute - time.Nanosecond)
	first, err = m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.False(t, first, "still inside the TTL")

	clock.advance(time.Nanosecond)
	first, err = m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.True(t, first, "an entry older than its TTL counts as absent")

	first, err = m.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.False(t, first, "the re-claim records the key again")
}

func TestMemoryStoreLRUBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, _ := setupStore(t, 3)
	for _, k := range []string{"a", "b", "c"} {
		first, err := m.Claim(ctx, k, time.Hour)
		require.NoError(t, err)
		require.True(t, first)
	}
	// Touch "a" so "b" becomes the least recently used.
	first, err := m.Claim(ctx, "a", time.Hour)
	require.NoError(t, err)
	require.False(t, first)

	first, err = m.Claim(ctx, "d", time.Hour)
	require.NoError(t, err)
	require.True(t, first)
	require.Equal(t, 3, m.Len(), "bound holds")

	for k, wantFirst := range map[string]bool{"a": false, "c": false, "d": false} {
		first, err := m.Claim(ctx, k, time.Hour)
		require.NoError(t, err)
		require.Equal(t, wantFirst, first, "key %s", k)
	}
	first, err = m.Claim(ctx, "b", time.Hour)
	require.NoError(t, err)
	require.True(t, first, "least recently used key was evicted")
	require.Equal(t, 3, m.Len())
}

func TestMemoryStoreRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, _ := setupStore(t, 10)
	_, err := m.Claim(ctx, "42", time.Hour)
	require.NoError(t, err)
	require.NoError(t, m.Release(ctx, "42"))
	require.NoError(t, m.Release(ctx, "never-claimed"))
	first, err := m.Claim(ctx, "42", time.Hour)
	require.NoError(t, err)
	require.True(t, first, "a released key is claimable again")
	require.Equal(t, 1, m.Len())
}

func TestMemoryStoreBadInput(t *testing.T) {
	t.Parallel()
	m, _ := setupStore(t, 10)
	_, err := m.Claim(context.Background(), "", time.Hour)
	require.ErrorIs(t, err, webhook.ErrInvalidKey)
	_, err = m.Claim(context.Background(), "42", 0)
	require.ErrorContains(t, err, "ttl 0s")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.Claim(ctx, "42", time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, m.Len())
}

func TestMemoryStoreConcurrentClaimsOneWinner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, _ := setupStore(t, 1000)
	const keys, claimers = 50, 8
	var winners [keys]atomic.Int32
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() {
			for k := range keys {
				first, err := m.Claim(ctx, fmt.Sprint(k), time.Hour)
				if err != nil {
					t.Error(err)
					return
				}
				if first {
					winners[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		require.Equal(t, int32(1), winners[k].Load(), "key %d", k)
	}
}
