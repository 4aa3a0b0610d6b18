package webhook_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/idempotencytest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T, now func() time.Time) webhook.IdempotencyStore {
		return webhook.NewMemoryStore(1000, webhook.WithStoreClock(now))
	})
}

func TestMemoryStoreLRUBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := webhook.NewMemoryStore(3)
	state := func(key string) webhook.ClaimState {
		t.Helper()
		c, err := m.Claim(ctx, key, time.Hour)
		require.NoError(t, err)
		return c.State
	}
	for _, k := range []string{"a", "b", "c"} {
		require.Equal(t, webhook.ClaimWon, state(k))
	}
	require.Equal(t, webhook.ClaimInProgress, state("a"), "touch a: b is now the least recently used")
	require.NoError(t, m.Complete(ctx, webhook.Claim{Key: "c"}, time.Hour))

	require.Equal(t, webhook.ClaimWon, state("d"))
	require.Equal(t, 3, m.Len(), "the bound holds")
	require.Equal(t, webhook.ClaimInProgress, state("a"))
	require.Equal(t, webhook.ClaimDone, state("c"))
	require.Equal(t, webhook.ClaimInProgress, state("d"))
	require.Equal(t, webhook.ClaimWon, state("b"), "the least recently used key was evicted")
	require.Equal(t, 3, m.Len())
}

func TestClaimStateString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "won", webhook.ClaimWon.String())
	require.Equal(t, "in-progress", webhook.ClaimInProgress.String())
	require.Equal(t, "done", webhook.ClaimDone.String())
	require.Equal(t, "ClaimState(9)", webhook.ClaimState(9).String())
}

func BenchmarkMemoryStoreClaimComplete(b *testing.B) {
	ctx := context.Background()
	m := webhook.NewMemoryStore(100_000)
	i := 0
	for b.Loop() {
		i++
		c, err := m.Claim(ctx, strconv.Itoa(i), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Complete(ctx, c, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
