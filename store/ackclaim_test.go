package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// AckClaim acks as AckStreams does (fenced by the lease, forward only)
// and then claims in the same transaction: a stream appended to while it
// was leased is taken again at once from its new watermark, a free
// pending stream is taken too, and neither a blocked stream nor one
// another owner holds is.
func TestAckClaimTakesAgainAStreamAppendedToWhileLeased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a1 := b.appendN(t, "a-1", 1)
	b1 := b.appendN(t, "b-1", 1)
	b.appendN(t, "blk-1", 1)
	claims, err := b.store.Claim(b.ctx, "x", 3, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a-1", "b-1", "blk-1"}, claimedNames(claims))
	require.NoError(t, b.store.Block(b.ctx, "x", "blk-1", -1, 0, "refused"))
	b.appendN(t, "blk-1", 1)
	b.appendN(t, "c-1", 1) // y's
	claims, err = b.store.Claim(b.ctx, "y", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"c-1"}, claimedNames(claims))
	b.appendN(t, "a-1", 1) // while x holds it: notifies nobody
	b.appendN(t, "d-1", 1) // free and pending

	errs, claims, events, again, err := b.store.AckClaim(b.ctx, "x", []event.Progress{
		{Stream: "b-1", Version: b1[0].Version, ID: b1[0].ID},
		{Stream: "c-1", Version: 0, ID: 1},
		{Stream: "a-1", Version: a1[0].Version, ID: a1[0].ID},
	}, 10, time.Minute, 10)
	require.NoError(t, err)
	require.False(t, again)
	require.Len(t, errs, 3)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], event.ErrLeaseLost, "c-1 is y's")
	require.NoError(t, errs[2])
	require.ElementsMatch(t, []string{"a-1", "d-1"}, claimedNames(claims),
		"a-1 again for the event appended while leased, d-1; not b-1 (caught up), blk-1 (blocked) or c-1 (y's)")
	for _, c := range claims {
		if c.Stream == "a-1" {
			require.Equal(t, int64(0), c.Watermark, "from the acked watermark")
		}
	}
	require.Len(t, events, 2, "fetched with the claim")
	for _, e := range events {
		require.Equal(t, map[string]int64{"a-1": 1, "d-1": 0}[e.Stream], e.Version, e.Stream)
	}
	require.Equal(t, int64(0), b.info(t, "b-1").Watermark)
	require.Empty(t, b.info(t, "b-1").LeasedBy)
	require.Equal(t, "y", b.info(t, "c-1").LeasedBy)
	require.Equal(t, int64(-1), b.info(t, "c-1").Watermark, "a lost lease advances nothing")
	require.Equal(t, "x", b.info(t, "a-1").LeasedBy)

	// The watermark never moves back: an ack behind it leaves it.
	errs, claims, events, _, err = b.store.AckClaim(b.ctx, "x", []event.Progress{{Stream: "a-1", Version: -1, ID: 0}}, 10, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []error{nil}, errs)
	require.Equal(t, int64(0), b.info(t, "a-1").Watermark)
	require.ElementsMatch(t, []string{"a-1"}, claimedNames(claims), "its event is still past the watermark")
	require.Nil(t, events, "perStream 0: claims only")

	_, _, _, _, err = b.store.AckClaim(b.ctx, "x", nil, 0, time.Minute, 0)
	require.ErrorIs(t, err, store.ErrInvalidInput)
	_, _, _, _, err = b.store.AckClaim(b.ctx, "x", nil, 10, time.Minute, -1)
	require.ErrorIs(t, err, store.ErrInvalidInput)
}

// An ack of one stream waits for the row an appender holds (as Ack does)
// and the claim that follows sees what it committed; acks of several
// streams skip such a row, ack it after the transaction and say so
// (again), since the claim could not take it again.
func TestAckClaimWaitsForOneAppenderAndReportsSkippedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listen(t, b.store.Schema()) // a drainer waits: appends lock the stream's row
	a1 := b.appendN(t, "a-1", 1)
	_, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = b.store.AppendTx(b.ctx, tx, "a-1", store.AnyVersion, ev("Happened", `{"n":1}`))
	require.NoError(t, err)
	type outcome struct {
		errs   []error
		claims []event.Claim
		again  bool
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		o.errs, o.claims, _, o.again, o.err = b.store.AckClaim(b.ctx, "x", []event.Progress{{Stream: "a-1", Version: a1[0].Version, ID: a1[0].ID}}, 10, time.Minute, 0)
		done <- o
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, "the ack waits for the appender's row")
	require.NoError(t, tx.Commit(b.ctx))
	o := <-done
	require.NoError(t, o.err)
	require.Equal(t, []error{nil}, o.errs)
	require.False(t, o.again)
	require.Equal(t, []string{"a-1"}, claimedNames(o.claims), "taken again for the event committed while the ack waited")
	require.Equal(t, int64(0), o.claims[0].Watermark)

	// Two streams held by x, one of them locked by an appender.
	b.appendN(t, "b-1", 1)
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"b-1"}, claimedNames(claims))
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = b.store.AppendTx(b.ctx, tx, "b-1", store.AnyVersion, ev("Happened", `{"n":1}`))
	require.NoError(t, err)
	go func() {
		var o outcome
		o.errs, o.claims, _, o.again, o.err = b.store.AckClaim(b.ctx, "x", []event.Progress{
			{Stream: "a-1", Version: 1, ID: 0},
			{Stream: "b-1", Version: 0, ID: 0},
		}, 10, time.Minute, 0)
		done <- o
	}()
	// a-1 is acked (and its transaction committed) while b-1 is held.
	require.Eventually(t, func() bool { return b.info(t, "a-1").Watermark == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(b.ctx))
	o = <-done
	require.NoError(t, o.err)
	require.Equal(t, []error{nil, nil}, o.errs)
	require.True(t, o.again, "b-1 was acked after the claim")
	require.Empty(t, o.claims)
	claims, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"b-1"}, claimedNames(claims), "the claim once more takes it")
}
