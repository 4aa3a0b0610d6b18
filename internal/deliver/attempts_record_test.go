package deliver_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/wire"
)

// failFirst answers 503 to the first request of each event id in ids and
// 204 to every other.
func failFirst(ids ...string) func(int, http.ResponseWriter, *http.Request) {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(_ int, w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		for _, f := range ids {
			if f == id && first {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// outcomes are the outcomes of tr's attempt records, in order.
func outcomes(tr inspect.EventTrace) []string {
	out := []string{}
	for _, a := range tr.Attempts {
		out = append(out, a.Outcome)
	}
	return out
}

// traceOnce waits until event id's trace holds n attempt records and
// returns it.
func traceOnce(t *testing.T, b bundle, id, sourceStream string, n int) inspect.EventTrace {
	t.Helper()
	var tr inspect.EventTrace
	require.Eventually(t, func() bool {
		var err error
		tr, err = inspect.TraceEvent(b.ctx, b.js, id, inspect.TraceConfig{SourceStream: sourceStream})
		return err == nil && len(tr.Attempts) == n
	}, 10*time.Second, 20*time.Millisecond, "event %s: %d attempt records", id, n)
	return tr
}

// Under the default mode (failures) a webhook answered 2xx at once leaves
// no attempt record, and one that failed and then succeeded leaves both
// attempts; under all, both leave every attempt. The trace of the first
// says from the durable consumer that it was settled.
func TestAttemptsRecordFailuresByDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mode  attemptlog.Mode
		first []string // event 1's recorded outcomes (answered 2xx at once)
	}{
		{"default", "", []string{}},
		{"failures", attemptlog.ModeFailures, []string{}},
		{"all", attemptlog.ModeAll, []string{attempt.OutcomeAck}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rc := newReceiver(t, failFirst("2"))
			log := attemptLog(t, b, nil)
			b.run(t, deliver.Config{Attempts: log, AttemptsRecord: tc.mode}, sub("orders", rc.URL))

			b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
			requireSettled(t, b, "orders", 1)
			b.publish(t, 2, "order-2", "OrderPlaced", `{}`)
			requireSettled(t, b, "orders", 2)
			rc.waitFor(t, 3)

			// One writer writes the records in order: once event 2's are
			// stored, event 1's would be.
			second := traceOnce(t, b, "2", "", 2)
			require.Equal(t, []string{attempt.OutcomeRetry, attempt.OutcomeAck}, outcomes(second))
			require.Equal(t, []int{1, 2}, []int{second.Attempts[0].Attempt, second.Attempts[1].Attempt})
			require.Equal(t, []int{503, 204}, []int{second.Attempts[0].Status, second.Attempts[1].Status})

			first, err := inspect.TraceEvent(b.ctx, b.js, "1", inspect.TraceConfig{SourceStream: "order-1"})
			require.NoError(t, err)
			require.Equal(t, tc.first, outcomes(first))
			require.NotNil(t, first.Message, "found by its stream")
			require.Len(t, first.Deliveries, 1)
			d := first.Deliveries[0]
			require.Equal(t, "orders", d.Subscription)
			require.Equal(t, "orders", d.Durable)
			require.False(t, d.Ordered)
			require.Equal(t, uint64(1), d.Sequence)
			require.Equal(t, inspect.DeliverySettled, d.State, d.Why)
			require.Contains(t, d.Why, "ack floor")
		})
	}
}

// The same on an ordered subscription (head-of-line retry in place):
// the 2xx at once leaves no record under the default, the failure and
// the success after it both do; the trace reads the first event settled
// from its partition's durable consumer on the partitioned copy.
func TestAttemptsRecordFailuresByDefaultOrdered(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	rc := newOrderedReceiver(t, b, func(e orderedEvent, attempt int) int {
		if e.stream == "order-2" && attempt == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	log := attemptLog(t, b.bundle, nil)
	s := orderedSub("ledger", rc.URL)
	b.runOrdered(t, deliver.Config{Attempts: log, ReplicaID: "one"}, s)

	b.publish(t, "order-1", 0, "OrderPlaced") // event 1
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 1 }, 20*time.Second, 10*time.Millisecond, "event 1 delivered")
	b.publish(t, "order-2", 0, "OrderPlaced") // event 2
	require.Eventually(t, func() bool { return len(rc.accepted()["order-2"]) == 1 }, 20*time.Second, 10*time.Millisecond, "event 2 delivered")

	second := traceOnce(t, b.bundle, "2", "", 2)
	require.Equal(t, []string{attempt.OutcomeRetry, attempt.OutcomeAck}, outcomes(second))
	require.Equal(t, []int{1, 2}, []int{second.Attempts[0].Attempt, second.Attempts[1].Attempt})

	var first inspect.EventTrace
	require.Eventually(t, func() bool {
		var err error
		first, err = inspect.TraceEvent(b.ctx, b.js, "1", inspect.TraceConfig{SourceStream: "order-1"})
		return err == nil && len(first.Deliveries) == 1 && first.Deliveries[0].State == inspect.DeliverySettled
	}, 10*time.Second, 20*time.Millisecond, "event 1 settled for ledger: %+v", first.Deliveries)
	require.Empty(t, first.Attempts, "a 2xx at once is not recorded")
	d := first.Deliveries[0]
	require.Equal(t, "ledger", d.Subscription)
	require.True(t, d.Ordered)
	require.Equal(t, wire.PartitionDurable("ledger", d.Partition), d.Durable)
	require.Equal(t, wire.StreamPartition("order-1", 4), d.Partition)
	require.Positive(t, d.Sequence, "its sequence in the partitioned copy")
}

// A failure retried in place without spending an attempt number (an
// ordered head the receiver's order gate refused for now: 409
// in-progress) makes the 2xx after it, still attempt 1, part of a series
// with a failure: both are recorded under the default.
func TestAttemptsRecordTheSuccessAfterAFailureInPlace(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		if first {
			w.Header().Set(wire.HeaderOrder, wire.OrderInProgress)
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	log := attemptLog(t, b.bundle, nil)
	b.runOrdered(t, deliver.Config{Attempts: log, ReplicaID: "one"}, orderedSub("ledger", rc.URL))

	b.publish(t, "order-1", 0, "OrderPlaced") // event 1
	tr := traceOnce(t, b.bundle, "1", "", 2)
	require.Equal(t, []string{attempt.OutcomeRetry, attempt.OutcomeAck}, outcomes(tr))
	require.Equal(t, []int{1, 1}, []int{tr.Attempts[0].Attempt, tr.Attempts[1].Attempt}, "an order gate's refusal spends no attempt")
	require.Equal(t, []int{http.StatusConflict, http.StatusOK}, []int{tr.Attempts[0].Status, tr.Attempts[1].Status})
}
