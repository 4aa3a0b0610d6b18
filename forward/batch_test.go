package forward_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// answers returns how many messages the connection received while fn ran:
// one PubAck per event when publishing one at a time, a few per fast batch.
func answers(b bundle, fn func()) uint64 {
	before := b.nc.Stats().InMsgs
	fn()
	return b.nc.Stats().InMsgs - before
}

// idsUpTo returns the event ids "1".."n".
func idsUpTo(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i + 1)
	}
	return out
}

func TestHandleUsesFastBatches(t *testing.T) {
	t.Parallel()
	b := setup(t) // Provision creates the stream with allow_batched
	evs := events("order-1", 1, 300)
	n := answers(b, func() {
		res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:200]}})
		require.Equal(t, drain.Result{Done: 200}, res[0])
		// The stream goes on where this Forwarder left it: batched again.
		res = b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[200:]}})
		require.Equal(t, drain.Result{Done: 100}, res[0])
	})
	require.Less(t, n, uint64(20), "two batches answered with a PubAck and a few flow acks, not one PubAck per event")
	require.Equal(t, idsUpTo(300), ids(b.stored(t, "events.order.order-1.")))
}

func TestHandleWithoutBatchPublishSendsOneAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}})
	require.NoError(t, err)
	evs := events("order-1", 1, 50)
	n := answers(b, func() {
		res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs}})
		require.Equal(t, drain.Result{Done: 50}, res[0])
	})
	require.GreaterOrEqual(t, n, uint64(50), "one PubAck per event")
	require.Len(t, b.stored(t, "events."), 50)
}

func TestFastBatchStopsAtRefusedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{MaxMsgSize: 2048}})
	evs := events("order-1", 1, 10)
	// The server's max payload lets event 5 through the client; the
	// stream's maximum message size refuses it in the middle of the batch.
	evs[4].Data = []byte(`{"pad":"` + strings.Repeat("x", 4096) + `"}`)
	// (A provisioned stream takes fast batches: TestHandleUsesFastBatches.)
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs}})
	require.Equal(t, 4, res[0].Done)
	require.ErrorIs(t, res[0].Err, forward.ErrTooLarge)
	require.ErrorContains(t, res[0].Err, "event 5")
	require.True(t, drain.IsNonRetryable(res[0].Err))
	require.Equal(t, []string{"1", "2", "3", "4"}, ids(b.stored(t, "events.")), "nothing after the refused event is stored")

	// The operator fixes the event; the drain retries from there.
	evs[4].Data = []byte(`{"n":4}`)
	res = b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Retry: 1, Reconcile: true, Events: evs[4:]}})
	require.Equal(t, drain.Result{Done: 6}, res[0])
	require.Equal(t, idsUpTo(10), ids(b.stored(t, "events.")))
}

func TestFastBatchRefusedFallsBackToOneAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 20)
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:10]}})
	require.Equal(t, drain.Result{Done: 10}, res[0])

	// An operator turns batches off while the Forwarder still thinks they
	// are allowed: the refused batch stores nothing and goes one at a time.
	s, err := b.js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.True(t, cfg.AllowBatchPublish)
	cfg.AllowBatchPublish = false
	_, err = b.js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)

	n := answers(b, func() {
		res = b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[10:]}})
	})
	require.Equal(t, drain.Result{Done: 10}, res[0])
	require.GreaterOrEqual(t, n, uint64(10), "one PubAck per event after the refusal")
	require.Equal(t, idsUpTo(20), ids(b.stored(t, "events.")))
}
