package deliver_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
)

// A dead letter JetStream refuses for lack of storage (max_file_store
// reached) is not lost: the message stays unacked, tried again with
// backoff, and is dead-lettered (and terminated) once space is freed.
func TestDeadLetterRefusedForStorageKeepsTheMessageUntilWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a JetStream store")
	}
	t.Parallel()
	b := setupSmallStore(t, 1<<20)
	ctx, js := b.ctx, b.js
	q := deadletter.New(js, deadletter.Config{})
	require.NoError(t, q.Provision(ctx))
	b.publish(t, 5, "order-1", "OrderPlaced", `{"n":5}`)
	filler := fillStore(t, b)

	rc := newReceiver(t, status(http.StatusBadRequest)) // permanent: dead-lettered at once
	s := sub("orders", rc.URL)
	s.BackOff = []time.Duration{50 * time.Millisecond}
	b.run(t, deliver.Config{DeadLetters: q}, s)

	// The dead letter is refused again and again; the message is never
	// acked or terminated meanwhile.
	rc.waitFor(t, 3)
	n, err := q.Count(ctx, "orders")
	require.NoError(t, err)
	require.Zero(t, n, "nothing dead-lettered while the store is full")
	info := b.info(t, "orders")
	require.Zero(t, info.AckFloor.Stream, "not acked or terminated")
	require.EqualValues(t, 1, uint64(info.NumAckPending)+info.NumPending, "still pending or out for redelivery")

	require.NoError(t, filler.Purge(ctx))
	require.Eventually(t, func() bool {
		n, err := q.Count(ctx, "orders")
		return err == nil && n == 1
	}, 30*time.Second, 20*time.Millisecond, "dead-lettered once space is freed")
	requireSettled(t, b, "orders", 1)
	got, err := q.List(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "5", got[0].EventID)
}
