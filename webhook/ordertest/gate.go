package ordertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// runGate checks an order gate over the store, request by request.
func runGate(t *testing.T, newStore NewStore) {
	processed := func(t *testing.T, a Answer) {
		t.Helper()
		require.Equal(t, http.StatusNoContent, a.Status, a.Body)
		require.Empty(t, a.Order, "a processed delivery carries the handler's answer only")
	}
	refused := func(t *testing.T, a Answer, order string) {
		t.Helper()
		require.Equal(t, http.StatusConflict, a.Status, a.Body)
		require.Equal(t, order, a.Order)
		require.Equal(t, "1", a.RetryAfter)
		require.True(t, wire.OrderRetryInPlace(a.Order))
	}

	t.Run("InOrder", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t))
		for v := range int64(3) {
			processed(t, Post(t, rc.URL, "order-1", v, 5))
		}
		require.Equal(t, []int64{0, 1, 2}, rc.Processed("order-1"))
		processed(t, Post(t, rc.URL, "order-2", 0, 5))
		require.Equal(t, []int64{0}, rc.Processed("order-2"), "streams are independent")
	})

	t.Run("DuplicateNotProcessed", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t))
		for v := range int64(3) {
			processed(t, Post(t, rc.URL, "order-1", v, 5))
		}
		for _, v := range []int64{1, 2, 0} {
			a := Post(t, rc.URL, "order-1", v, 5)
			require.Equal(t, http.StatusNoContent, a.Status, a.Body)
			require.Equal(t, wire.OrderDuplicate, a.Order)
			require.False(t, wire.OrderRetryInPlace(a.Order))
		}
		a := Post(t, rc.URL, "order-1", 1, 9)
		require.Equal(t, wire.OrderDuplicate, a.Order, "a newer owner's duplicate is a duplicate too")
		require.Equal(t, []int64{0, 1, 2}, rc.Processed("order-1"))
	})

	t.Run("GapRetriedInPlace", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t))
		refused(t, Post(t, rc.URL, "order-1", 1, 5), wire.OrderGap) // strict: a stream starts at 0
		processed(t, Post(t, rc.URL, "order-1", 0, 5))
		refused(t, Post(t, rc.URL, "order-1", 2, 5), wire.OrderGap)
		require.Equal(t, []int64{0}, rc.Processed("order-1"), "a gap is never processed")
		processed(t, Post(t, rc.URL, "order-1", 1, 5))
		processed(t, Post(t, rc.URL, "order-1", 2, 5)) // the sender's retry in place
		require.Equal(t, []int64{0, 1, 2}, rc.Processed("order-1"))
	})

	t.Run("ZombieStaleEpochNeverProcessed", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t))
		processed(t, Post(t, rc.URL, "order-1", 0, 5)) // the old owner, epoch 5
		processed(t, Post(t, rc.URL, "order-1", 1, 8)) // the new owner, epoch 8, sent v1 …
		processed(t, Post(t, rc.URL, "order-1", 2, 8)) // … and v2
		// The old owner, frozen mid-POST of v1, wakes and sends it.
		refused(t, Post(t, rc.URL, "order-1", 1, 5), wire.OrderStaleEpoch)
		refused(t, Post(t, rc.URL, "order-1", 3, 5), wire.OrderStaleEpoch)
		require.Equal(t, []int64{0, 1, 2}, rc.Processed("order-1"))
		processed(t, Post(t, rc.URL, "order-1", 3, 8))
		processed(t, Post(t, rc.URL, "order-1", 4, 11)) // a later owner
		require.Equal(t, []int64{0, 1, 2, 3, 4}, rc.Processed("order-1"))
	})

	t.Run("HandlerFailureDoesNotAdvance", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		rc := NewReceiver(t, store)
		processed(t, Post(t, rc.URL, "order-1", 0, 5))
		rc.FailNext("order-1", 1)
		a := Post(t, rc.URL, "order-1", 1, 9)
		require.Equal(t, http.StatusInternalServerError, a.Status, "the handler's answer passes through")
		require.Empty(t, a.Order)
		pos, err := store.Position(context.Background(), webhook.OrderKey{Source: Source, Stream: "order-1"})
		require.NoError(t, err)
		require.Equal(t, webhook.OrderPosition{Version: 0, Epoch: 5, Partition: 0}, pos, "neither the version nor the epoch moved")
		refused(t, Post(t, rc.URL, "order-1", 2, 9), wire.OrderGap)
		processed(t, Post(t, rc.URL, "order-1", 1, 5)) // epoch 9 was never processed: 5 is not stale
		processed(t, Post(t, rc.URL, "order-1", 2, 9))
		require.Equal(t, []int64{0, 1, 2}, rc.Processed("order-1"))
	})

	t.Run("FirstSeenStartsTheStream", func(t *testing.T) {
		t.Parallel()
		rc := NewReceiver(t, newStore(t), webhook.WithGateFirstSeen())
		processed(t, Post(t, rc.URL, "order-1", 7, 5))
		a := Post(t, rc.URL, "order-1", 6, 5)
		require.Equal(t, wire.OrderDuplicate, a.Order, "versions before the first processed count as processed")
		refused(t, Post(t, rc.URL, "order-1", 9, 5), wire.OrderGap)
		processed(t, Post(t, rc.URL, "order-1", 8, 5))
		require.Equal(t, []int64{7, 8}, rc.Processed("order-1"))
	})

	t.Run("NamespacesAreSeparate", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		a, b := NewReceiver(t, store, webhook.WithGateNamespace("sub-a")), NewReceiver(t, store, webhook.WithGateNamespace("sub-b"))
		processed(t, Post(t, a.URL, "order-1", 0, 50))
		processed(t, Post(t, b.URL, "order-1", 0, 3)) // another subscription's lower epoch
		processed(t, Post(t, b.URL, "order-1", 1, 3))
		refused(t, Post(t, a.URL, "order-1", 2, 50), wire.OrderGap)
	})
}

// Hammer checks that concurrent senders never get one stream processed out
// of order or twice, nor two of its requests processed at once: for each
// store (a receiver replica each, sharing whatever the stores share) an
// order gate behind a real HTTP server; 6 senders post random versions
// near the next expected one of 3 streams, to random replicas, until every
// stream has 20 versions processed. Half the senders name the version
// chain's previous version, half are senders before the chain.
func Hammer(t *testing.T, stores ...webhook.OrderStore) {
	t.Helper()
	const senders, streams, versions = 6, 3, 20
	rec := newRecorder()
	receivers := make([]*Receiver, len(stores))
	for i, s := range stores {
		receivers[i] = newReceiver(t, s, rec)
	}
	next := func(stream string) int64 { return int64(len(rec.Processed(stream))) }
	var posts, refusedCount atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for i := range senders {
		chained := i%2 == 0
		wg.Go(func() {
			for attempt := 0; ; attempt++ {
				if attempt > 20_000 {
					errs <- fmt.Errorf("no progress after %d posts", attempt)
					return
				}
				stream := fmt.Sprint("stream-", rand.IntN(streams))
				n := next(stream)
				done := true
				for s := range streams {
					done = done && next(fmt.Sprint("stream-", s)) >= versions
				}
				if done {
					return
				}
				if n >= versions {
					continue
				}
				v := max(0, min(versions-1, n+int64(rand.IntN(5))-2))
				a, err := post(receivers[rand.IntN(len(receivers))].URL, stream, v, 1, chained)
				if err != nil {
					errs <- err
					return
				}
				posts.Add(1)
				switch {
				case a.Status == http.StatusNoContent:
				case a.Status == http.StatusConflict && wire.OrderRetryInPlace(a.Order):
					refusedCount.Add(1)
					runtime.Gosched()
				default:
					errs <- fmt.Errorf("%s v%d: answer %d %q %q", stream, v, a.Status, a.Order, a.Body)
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
	want := make([]int64, versions)
	for i := range want {
		want[i] = int64(i)
	}
	for s := range streams {
		require.Equal(t, want, rec.Processed(fmt.Sprint("stream-", s)), "stream-%d processed in order, each version once", s)
	}
	require.Empty(t, rec.Overlaps(), "requests of one stream processed at once")
	t.Logf("%d posts, %d refused for order, %d processed", posts.Load(), refusedCount.Load(), streams*versions)
}
