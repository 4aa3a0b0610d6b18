package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// Append is one statement: a concurrent append that takes the same
// versions first makes it a *ConcurrencyError naming the head that
// append left, whether the caller expected a version or any.
func TestAppendLosingARaceIsConcurrencyError(t *testing.T) {
	t.Parallel()
	for _, expected := range []int64{0, store.AnyVersion} {
		b := setup(t)
		b.appendN(t, "cart-7", 1)

		tx1, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		_, err = b.store.AppendTx(b.ctx, tx1, "cart-7", 0, ev("FromTx1", `{}`))
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			// Passes the head check (tx1 has not committed), then waits on
			// the unique index entry tx1 holds.
			_, err := b.store.Append(b.ctx, "cart-7", expected, ev("FromAppend", `{}`))
			done <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'WITH h AS%' AND strpos(query, $1) > 0`, b.store.EventsTable()).Scan(&n)
			return err == nil && n == 1
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, tx1.Commit(b.ctx))

		err = <-done
		var ce *store.ConcurrencyError
		require.ErrorAs(t, err, &ce, "expected %d", expected)
		require.Equal(t, store.ConcurrencyError{Stream: "cart-7", Expected: expected, Actual: 1}, *ce)
		require.Equal(t, int64(1), b.info(t, "cart-7").Head, "expected %d: nothing appended by the loser", expected)
	}
}

func TestAppendReturnsTheStoredEventsInVersionOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "cart-9", 2)
	out, err := b.store.Append(b.ctx, "cart-9", 1,
		store.NewEvent{Name: "A", Data: []byte(`{"a":1}`), Meta: event.Meta{Correlation: "c-1"}},
		ev("B", `{"b":2}`), ev("C", `[3]`))
	require.NoError(t, err)
	require.Len(t, out, 3)
	for i, e := range out {
		require.Equal(t, "cart-9", e.Stream)
		require.Equal(t, int64(2+i), e.Version)
		require.False(t, e.Created.IsZero())
		if i > 0 {
			require.Greater(t, e.ID, out[i-1].ID, "ids follow versions")
		}
	}
	require.Equal(t, []string{"A", "B", "C"}, []string{out[0].Name, out[1].Name, out[2].Name})
	require.JSONEq(t, `{"a":1}`, string(out[0].Data))
	require.Equal(t, "c-1", out[0].Meta.Correlation)
	require.Equal(t, int64(4), b.info(t, "cart-9").Head)
}
