// Package idempotencytest is the behaviour every webhook.IdempotencyStore
// must have, as one test suite: webhook's MemoryStore and pgstore's Postgres
// store both run it, so they stay interchangeable. A store of your own can
// run it too.
package idempotencytest

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

// Clock is the settable clock the suite hands to the store under test.
// Its zero value shows the unix epoch.
type Clock struct{ unixNano atomic.Int64 }

// NewClock returns a Clock showing start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.unixNano.Store(start.UnixNano())
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.unixNano.Load()).UTC() }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.unixNano.Add(int64(d)) }

// NewStore returns an empty store measuring leases and TTLs with now. It is
// called once per subtest, which may run in parallel.
type NewStore func(t *testing.T, now func() time.Time) webhook.IdempotencyStore

// Eps is the smallest clock step the suite relies on: Postgres keeps
// timestamps to the microsecond.
const Eps = time.Microsecond

// Run runs the suite against the stores newStore makes.
func Run(t *testing.T, newStore NewStore) {
	setup := func(t *testing.T) (webhook.IdempotencyStore, *Clock) {
		t.Helper()
		c := NewClock(time.Unix(1_700_000_000, 0))
		return newStore(t, c.Now), c
	}
	ctx := context.Background()
	claim := func(t *testing.T, s webhook.IdempotencyStore, key string, lease time.Duration) webhook.Claim {
		t.Helper()
		c, err := s.Claim(ctx, key, lease)
		require.NoError(t, err)
		require.Equal(t, key, c.Key)
		return c
	}

	t.Run("ClaimOnce", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		c := claim(t, s, "42", time.Minute)
		require.Equal(t, webhook.ClaimWon, c.State)
		require.NotEmpty(t, c.Token)
		require.Equal(t, time.Minute, c.Remaining)
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State)
		require.Equal(t, webhook.ClaimWon, claim(t, s, "43", time.Minute).State, "another key is independent")

		require.NoError(t, s.Complete(ctx, c, time.Hour))
		done := claim(t, s, "42", time.Minute)
		require.Equal(t, webhook.ClaimDone, done.State)
		require.Empty(t, done.Token)
		require.Equal(t, time.Hour, done.Remaining)
	})

	t.Run("ConcurrentClaimsOneWinner", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		const keys, claimers = 20, 6
		var won [keys]atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, claimers)
		for range claimers {
			wg.Go(func() {
				for k := range keys {
					c, err := s.Claim(ctx, fmt.Sprint("k", k), time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if c.State == webhook.ClaimWon {
						won[k].Add(1)
					} else if c.State != webhook.ClaimInProgress {
						errs <- fmt.Errorf("key k%d: state %v, want won or in-progress", k, c.State)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for k := range keys {
			require.Equal(t, int32(1), won[k].Load(), "key k%d", k)
		}
	})

	t.Run("InProgressDuplicate", func(t *testing.T) {
		t.Parallel()
		s, clock := setup(t)
		c := claim(t, s, "42", time.Minute)
		clock.Advance(20 * time.Second)
		dup := claim(t, s, "42", time.Hour)
		require.Equal(t, webhook.ClaimInProgress, dup.State)
		require.Empty(t, dup.Token)
		require.Equal(t, 40*time.Second, dup.Remaining, "the rest of the first lease; the duplicate's lease changed nothing")
		require.NoError(t, s.Release(ctx, dup), "a duplicate holds no lease to release")
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State)

		require.NoError(t, s.Complete(ctx, c, time.Hour))
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State, "only completion turns in-progress into done")
	})

	t.Run("ReleaseThenRetryRuns", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		first := claim(t, s, "42", time.Minute)
		require.NoError(t, s.Release(ctx, first))
		retry := claim(t, s, "42", time.Minute)
		require.Equal(t, webhook.ClaimWon, retry.State, "a released key is claimable again")
		require.NotEqual(t, first.Token, retry.Token)

		require.NoError(t, s.Release(ctx, first), "a stale lease releases nothing")
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State)

		require.NoError(t, s.Complete(ctx, retry, time.Hour))
		require.NoError(t, s.Release(ctx, retry), "releasing a done key changes nothing")
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State)

		require.NoError(t, s.Release(ctx, webhook.Claim{Key: "never-claimed", Token: "x"}))
	})

	t.Run("LeaseExpiry", func(t *testing.T) {
		t.Parallel()
		s, clock := setup(t)
		crashed := claim(t, s, "42", time.Minute)
		clock.Advance(time.Minute - Eps)
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State, "inside the lease")
		clock.Advance(Eps)
		takeover := claim(t, s, "42", time.Minute)
		require.Equal(t, webhook.ClaimWon, takeover.State, "an expired lease counts as absent")

		require.NoError(t, s.Release(ctx, crashed), "the expired holder cannot release the new one")
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State)

		require.NoError(t, s.Complete(ctx, crashed, time.Hour), "a late completion still records done")
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State)
		require.NoError(t, s.Release(ctx, takeover))
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State)
	})

	t.Run("TTLExpiry", func(t *testing.T) {
		t.Parallel()
		s, clock := setup(t)
		require.NoError(t, s.Complete(ctx, claim(t, s, "42", time.Minute), time.Hour))
		clock.Advance(time.Hour - Eps)
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State, "inside the TTL")
		clock.Advance(Eps)
		c := claim(t, s, "42", time.Minute)
		require.Equal(t, webhook.ClaimWon, c.State, "a done record older than its TTL counts as absent")
		require.Equal(t, webhook.ClaimInProgress, claim(t, s, "42", time.Minute).State)
	})

	t.Run("CompleteWithoutClaim", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		require.NoError(t, s.Complete(ctx, webhook.Claim{Key: "42"}, time.Hour))
		require.Equal(t, webhook.ClaimDone, claim(t, s, "42", time.Minute).State)
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		_, err := s.Claim(ctx, "", time.Minute)
		require.ErrorIs(t, err, webhook.ErrInvalidKey)
		require.ErrorIs(t, s.Complete(ctx, webhook.Claim{}, time.Hour), webhook.ErrInvalidKey)
		require.ErrorIs(t, s.Release(ctx, webhook.Claim{}), webhook.ErrInvalidKey)
		_, err = s.Claim(ctx, "42", 0)
		require.ErrorContains(t, err, "lease 0s")
		require.ErrorContains(t, s.Complete(ctx, webhook.Claim{Key: "42"}, -time.Second), "ttl -1s")

		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = s.Claim(cancelled, "42", time.Minute)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, s.Complete(cancelled, webhook.Claim{Key: "42"}, time.Hour), context.Canceled)
		require.ErrorIs(t, s.Release(cancelled, webhook.Claim{Key: "42"}), context.Canceled)

		require.Equal(t, webhook.ClaimWon, claim(t, s, "42", time.Minute).State, "nothing was recorded by the failed calls")
	})
}
