package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

func TestAckStreamsAcksEachStreamAndFencesALostLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a1 := b.appendN(t, "a-1", 3)
	b1 := b.appendN(t, "b-1", 3)
	c1 := b.appendN(t, "c-1", 2)
	// Oldest first: x holds a-1 and b-1; c-1 is y's, so x has no lease on it.
	claims, err := b.store.Claim(b.ctx, "x", 2, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a-1", "b-1"}, claimedNames(claims))
	claims, err = b.store.Claim(b.ctx, "y", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"c-1"}, claimedNames(claims))
	// b-1 failed once before: the ack resets its retry count and error.
	require.NoError(t, b.store.Retry(b.ctx, "x", "b-1", -1, 0, 0, "refused"))
	claims, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"b-1"}, claimedNames(claims))

	errs := b.store.AckStreams(b.ctx, "x", []event.Progress{
		{Stream: "c-1", Version: c1[1].Version, ID: c1[1].ID},
		{Stream: "a-1", Version: a1[2].Version, ID: a1[2].ID},
		{Stream: "b-1", Version: b1[1].Version, ID: b1[1].ID},
	})
	require.Len(t, errs, 3)
	require.ErrorIs(t, errs[0], event.ErrLeaseLost, "c-1 is y's")
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])

	a := b.info(t, "a-1")
	require.Equal(t, int64(2), a.Watermark)
	require.Empty(t, a.LeasedBy, "the ack releases the lease")
	bi := b.info(t, "b-1")
	require.Equal(t, int64(1), bi.Watermark, "partial progress")
	require.Equal(t, 0, bi.Retry)
	require.Empty(t, bi.Error)
	require.True(t, bi.NextAttempt.IsZero())
	c := b.info(t, "c-1")
	require.Equal(t, int64(-1), c.Watermark, "a lost lease advances nothing")
	require.Equal(t, "y", c.LeasedBy)

	// b-1 has an event left past its watermark: it is claimable at once,
	// from the acked watermark; a-1 is caught up and is not.
	claims, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, "b-1", claims[0].Stream)
	require.Equal(t, int64(1), claims[0].Watermark)

	// Never back, and a stream named twice is refused.
	errs = b.store.AckStreams(b.ctx, "x", []event.Progress{
		{Stream: "b-1", Version: b1[0].Version, ID: b1[0].ID},
		{Stream: "b-1", Version: b1[2].Version, ID: b1[2].ID},
	})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], store.ErrInvalidInput)
	require.ErrorContains(t, errs[1], `"b-1"`)
	require.Equal(t, int64(1), b.info(t, "b-1").Watermark, "an ack never moves the watermark back")
}

func TestAckStreamsExpiredLeasesAdvanceNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a1 := b.appendN(t, "a-1", 2)
	b1 := b.appendN(t, "b-1", 2)
	claims, err := b.store.Claim(b.ctx, "slow", 10, 20*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	time.Sleep(40 * time.Millisecond) // the lease's expiry is the subject

	errs := b.store.AckStreams(b.ctx, "slow", []event.Progress{
		{Stream: "a-1", Version: a1[1].Version, ID: a1[1].ID},
		{Stream: "b-1", Version: b1[1].Version, ID: b1[1].ID},
	})
	for i, err := range errs {
		require.ErrorIs(t, err, event.ErrLeaseLost, "ack %d", i)
	}
	for _, s := range []string{"a-1", "b-1"} {
		si := b.info(t, s)
		require.Equal(t, int64(-1), si.Watermark, s)
		require.Equal(t, "slow", si.LeasedBy, "%s: the expired lease is left for the next claim", s)
	}
}

// An application transaction appending to b-1 and then to a-1 holds b-1's
// row while it waits for a-1's: a statement acking a-1 and b-1 together
// that locked a-1 and waited for b-1 would deadlock with it (and Postgres
// would abort one of the two). AckStreams acks a-1 without waiting, then
// b-1 alone once the appender commits; the appender's transaction goes
// through.
func TestAckStreamsNeverDeadlocksWithAnAppender(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listen(t, b.store.Schema()) // a drainer waits: appends lock the stream's row
	a1 := b.appendN(t, "a-1", 1)
	b1 := b.appendN(t, "b-1", 1)
	_, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = b.store.AppendTx(b.ctx, tx, "b-1", store.AnyVersion, ev("Happened", `{"n":1}`))
	require.NoError(t, err)

	done := make(chan []error, 1)
	go func() {
		done <- b.store.AckStreams(b.ctx, "x", []event.Progress{
			{Stream: "a-1", Version: a1[0].Version, ID: a1[0].ID},
			{Stream: "b-1", Version: b1[0].Version, ID: b1[0].ID},
		})
	}()
	// a-1 is acked while the appender still holds b-1.
	require.Eventually(t, func() bool { return b.info(t, "a-1").Watermark == 0 }, 10*time.Second, 5*time.Millisecond)
	select {
	case errs := <-done:
		t.Fatalf("acks returned while b-1's row was held: %v", errs)
	default:
	}

	_, err = b.store.AppendTx(b.ctx, tx, "a-1", store.AnyVersion, ev("Happened", `{"n":1}`))
	require.NoError(t, err, "the appender is not a deadlock victim")
	require.NoError(t, tx.Commit(b.ctx))
	select {
	case errs := <-done:
		require.Equal(t, []error{nil, nil}, errs)
	case <-time.After(10 * time.Second):
		t.Fatal("b-1's ack did not finish after the appender committed")
	}
	for _, s := range []string{"a-1", "b-1"} {
		si := b.info(t, s)
		require.Equal(t, int64(0), si.Watermark, s)
		require.Equal(t, int64(1), si.Head, "%s: the appended event is pending", s)
	}
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a-1", "b-1"}, claimedNames(claims), "both are claimable for the new events")
}
