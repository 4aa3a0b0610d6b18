package deliver_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// flakyDLQ fails its first DeadLetter calls, then stores in a real DLQ.
type flakyDLQ struct {
	q     *deadletter.DLQ
	fails atomic.Int32
	calls atomic.Int32
}

func (f *flakyDLQ) DeadLetter(ctx context.Context, dl deadletter.Letter) error {
	if f.calls.Add(1) <= f.fails.Load() {
		return errors.New("dead-letter store down")
	}
	return f.q.DeadLetter(ctx, dl)
}

func TestDeadLetterFailureOnLastAttemptKeepsTheEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	dlq := &flakyDLQ{q: q}
	dlq.fails.Store(1)
	rc := newReceiver(t, status(http.StatusBadGateway))
	s := sub("orders", rc.URL)
	s.MaxDeliver = 2
	s.BackOff = []time.Duration{20 * time.Millisecond}
	b.run(t, deliver.Config{DeadLetters: dlq}, s)
	b.publish(t, 5, "order-1", "OrderPlaced", `{"n":5}`)

	// Attempt 2 fails, its dead letter fails: the message must come back
	// (attempt 3 fails too) and then be dead-lettered.
	require.Eventually(t, func() bool {
		n, err := q.Count(b.ctx, "orders")
		return err == nil && n == 1
	}, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, int32(2), dlq.calls.Load())
	require.Equal(t, 3, rc.count())
	requireSettled(t, b, "orders", 1)

	got, err := q.List(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, "orders", d.Subscription)
	require.Equal(t, "5", d.EventID)
	require.Equal(t, 3, d.Attempts)
	require.Equal(t, http.StatusBadGateway, d.Status)
	require.Contains(t, d.Reason, "HTTP 502")
	require.Equal(t, "events.order.order-1.OrderPlaced", d.Subject)
	require.Equal(t, uint64(1), d.StreamSeq)
	require.Equal(t, `{"n":5}`, string(d.Data))
	require.Equal(t, "OrderPlaced", d.Header.Get("ce-type"), "the original headers are kept")
	require.False(t, d.PublishedAt.IsZero())
	require.False(t, d.LastAttemptAt.Before(d.PublishedAt))
	require.False(t, d.DeadLetteredAt.Before(d.LastAttemptAt))
}

func TestDLQListGetPurgeBySubscription(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	require.NoError(t, q.Provision(b.ctx), "provisioning twice leaves the stream alone")
	for i, name := range []string{"a", "b", "a"} {
		require.NoError(t, q.DeadLetter(b.ctx, deadletter.Letter{Subscription: name, EventID: string(rune('1' + i)), Reason: "test"}))
	}
	all, err := q.List(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, all, 3)
	onlyA, err := q.List(b.ctx, "a")
	require.NoError(t, err)
	require.Len(t, onlyA, 2)
	require.Equal(t, []string{"1", "3"}, []string{onlyA[0].EventID, onlyA[1].EventID})
	got, err := q.Get(b.ctx, all[1].Seq)
	require.NoError(t, err)
	require.Equal(t, "b", got.Subscription)

	// The same subscription and event id again is dropped by the
	// duplicate window.
	require.NoError(t, q.DeadLetter(b.ctx, deadletter.Letter{Subscription: "a", EventID: "1", Reason: "again"}))
	n, err := q.Count(b.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, uint64(2), n)

	removed, err := q.Purge(b.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, uint64(2), removed)
	left, err := q.List(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, "b", left[0].Subscription)
	_, err = q.Get(b.ctx, all[0].Seq)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
}

func TestReplayDeliversWithSameKeyAndDeletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	var fixed atomic.Bool
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if fixed.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusUnprocessableEntity)
	})
	reg := prometheus.NewRegistry()
	s := sub("orders", rc.URL)
	b.run(t, deliver.Config{DeadLetters: q, Registerer: reg}, s)
	b.publish(t, 31, "order-1", "OrderPlaced", `{"n":31}`)
	require.Eventually(t, func() bool { n, err := q.Count(b.ctx, ""); return err == nil && n == 1 }, 15*time.Second, 20*time.Millisecond)
	// The counter moves just after the dead letter is stored: wait for it.
	require.Eventually(t, func() bool {
		v, ok := counterOf(reg, "jsbridge_consumer_dead_letters_total")
		return ok && v == 1
	}, 5*time.Second, 10*time.Millisecond, "one dead letter counted")

	letters, err := q.List(b.ctx, "")
	require.NoError(t, err)
	stray := letters[0]
	stray.Subscription = "unknown"
	replayer, err := deliver.New(b.js, deliver.Config{Registerer: reg}, s)
	require.NoError(t, err)
	fixed.Store(true)
	res := replayer.Replay(b.ctx, q, []deadletter.Stored{letters[0], stray})
	require.Len(t, res, 2)
	require.True(t, res[0].Delivered, "%v", res[0].Err)
	require.Equal(t, http.StatusOK, res[0].Status)
	require.ErrorIs(t, res[1].Err, deliver.ErrUnknownSubscription)

	reqs := rc.requests()
	require.Len(t, reqs, 2)
	require.Equal(t, "31", reqs[1].header.Get(wire.HeaderIdempotencyKey))
	require.Equal(t, reqs[0].header.Get(wire.HeaderIdempotencyKey), reqs[1].header.Get(wire.HeaderIdempotencyKey))
	require.Equal(t, reqs[0].body, reqs[1].body, "the replay sends the same body")
	n, err := q.Count(b.ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "a delivered dead letter is deleted")
	require.Equal(t, 1.0, counterValue(t, reg, "jsbridge_consumer_dead_letters_replayed_total"))
}

// counterValue returns the value of the single series of counter name on reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, ok := counterOf(reg, name)
	require.True(t, ok, "metric %s not registered (or not one series)", name)
	return v
}

// counterOf returns the value of the single series of counter name on reg,
// and false when there is no such series yet.
func counterOf(reg *prometheus.Registry, name string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// Events published by the bridge's forwarder carry its fence
// (Nats-Expected-Last-Subject-Sequence over the stream's subjects,
// Nats-Expected-Stream): every one of them that is given up on (a 422 on
// one subscription, MaxDeliver on the other) lands in the DLQ, whose copy
// carries no Nats-* header but its own Nats-Msg-Id. Before, the copied
// fence made JetStream refuse all but the first dead letter of a stream.
func TestDeadLettersOfFencedEventsAreAllStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	rejecting := newReceiver(t, status(http.StatusUnprocessableEntity))
	failing := newReceiver(t, status(http.StatusServiceUnavailable))
	never, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
	require.NoError(t, err)
	exhausted := sub("exhausted", failing.URL)
	exhausted.MaxDeliver = 2
	exhausted.BackOff = []time.Duration{10 * time.Millisecond}
	b.run(t, deliver.Config{DeadLetters: q, Breakers: never}, sub("rejected", rejecting.URL), exhausted)

	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	const streams, rounds = 5, 4
	id := int64(0)
	for v := range rounds {
		var evs []event.Event
		for s := range streams {
			id++
			evs = append(evs, event.Event{ID: id, Stream: fmt.Sprintf("order-%d", s), Version: int64(v), Name: "OrderNoted",
				Data: []byte(`{}`), Created: time.Now()})
		}
		for _, o := range fwd.Publish(b.ctx, evs) {
			require.NoError(t, o.Err)
		}
	}
	// The originals carry the fence that used to be copied.
	s, err := b.js.Stream(b.ctx, "EVENTS")
	require.NoError(t, err)
	last, err := s.GetMsg(b.ctx, uint64(id))
	require.NoError(t, err)
	require.NotEmpty(t, last.Header.Get("Nats-Expected-Last-Subject-Sequence"), "the forwarder fences its publishes: %v", last.Header)

	for _, name := range []string{"rejected", "exhausted"} {
		require.Eventually(t, func() bool {
			n, err := q.Count(b.ctx, name)
			return err == nil && n == uint64(id)
		}, 30*time.Second, 20*time.Millisecond, "subscription %s: every event dead-lettered", name)
	}
	letters, err := q.List(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, letters, 2*int(id))
	for _, d := range letters {
		for k := range d.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") {
				require.Equal(t, "Nats-Msg-Id", k, "dead letter %d carries %s", d.Seq, k)
			}
		}
		require.Equal(t, d.Subscription+":"+d.EventID, d.Header.Get("Nats-Msg-Id"))
		require.Equal(t, "OrderNoted", d.Header.Get("ce-type"), "the reader headers are kept")
		require.Equal(t, "application/json", d.Header.Get("Content-Type"))
	}
}

// A dead-letter stream that does not hold dlq.> is refused at Provision;
// one deleted at run time is provisioned again by the next dead letter.
func TestDLQProvisionChecksSubjectsAndDeadLetterRecreatesTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "ODD", Subjects: []string{"odd.>"}})
	require.NoError(t, err)
	err = deadletter.New(b.js, deadletter.Config{Stream: "ODD"}).Provision(b.ctx)
	require.ErrorIs(t, err, deadletter.ErrSubjects)
	require.ErrorContains(t, err, `"dlq.>"`)

	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	require.NoError(t, b.js.DeleteStream(b.ctx, "DLQ"))
	require.NoError(t, q.DeadLetter(b.ctx, deadletter.Letter{Subscription: "a", EventID: "1", Reason: "test"}))
	n, err := q.Count(b.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, uint64(1), n)
}

// Replay POSTs a dead letter with the webhook's own headers: none of the
// stored message's Nats-* headers (a dead letter written before they were
// left out may hold the bridge's fence) reaches the endpoint.
func TestReplaySendsNoNatsHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	rc := newReceiver(t, status(http.StatusOK))
	s := sub("orders", rc.URL)
	s.Body = subscription.BodyBinary
	c, err := deliver.New(b.js, deliver.Config{}, s)
	require.NoError(t, err)
	old := deadletter.Stored{Subscription: "orders", EventID: "9", Data: []byte(`{}`), Header: nats.Header{
		"ce-id": {"9"}, "ce-type": {"OrderPlaced"}, "Content-Type": {"application/json"},
		"Nats-Expected-Last-Subject-Sequence": {"41"}, "Nats-Expected-Stream": {"EVENTS"}, "Nats-Msg-Id": {"orders:9"},
	}}
	res := c.Replay(b.ctx, q, []deadletter.Stored{old})
	require.Len(t, res, 1)
	require.Equal(t, http.StatusOK, res[0].Status)
	got := rc.requests()
	require.Len(t, got, 1)
	for k := range got[0].header {
		require.False(t, strings.HasPrefix(strings.ToLower(k), "nats-"), "replay sent %s", k)
	}
	require.Equal(t, "OrderPlaced", got[0].header.Get("ce-type"))
}
