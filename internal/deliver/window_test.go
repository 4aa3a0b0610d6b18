package deliver_test

import (
	"errors"
	"net/http"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// windowBundle holds events published before, in and after a time window:
// the window's event ids in stream order, and its bounds.
type windowBundle struct {
	*orderedBundle
	since, until time.Time
	in           []string // the window's order events, in stream order
	inStream     map[string][]string
}

// setupWindow publishes order-1 v0-2 and order-2 v0-1 before the window;
// order-1 v3-5, order-2 v2-3 interleaved and invoice-1 v0 (not selected by
// the subscriptions' events.order.>) in it; order-1 v6 and order-2 v4
// after it. The bounds are the JetStream times of the messages around.
func setupWindow(t *testing.T) *windowBundle {
	t.Helper()
	b := &windowBundle{orderedBundle: setupOrdered(t), inStream: map[string][]string{}}
	timeOf := func(seq uint64) time.Time {
		s, err := b.js.Stream(b.ctx, "EVENTS")
		require.NoError(t, err)
		m, err := s.GetMsg(b.ctx, seq)
		require.NoError(t, err)
		return m.Time
	}
	b.publishStream(t, "order-1", 0, 3)
	b.publishStream(t, "order-2", 0, 2)
	b.since = timeOf(5).Add(time.Nanosecond)
	for _, e := range []orderedEvent{{"order-1", 3}, {"order-2", 2}, {"invoice-1", 0}, {"order-1", 4}, {"order-2", 3}, {"order-1", 5}} {
		b.publish(t, e.stream, e.version, "Noted")
		if e.stream != "invoice-1" {
			id := event.FormatID(b.nextID - 1)
			b.in = append(b.in, id)
			b.inStream[e.stream] = append(b.inStream[e.stream], id)
		}
	}
	b.until = timeOf(11).Add(time.Nanosecond)
	b.publishStream(t, "order-1", 6, 7)
	b.publishStream(t, "order-2", 4, 5)
	return b
}

// newWindowConsumer is a Consumer of one subscription to rc, its durable
// consumer created (Provision) and never run.
func newWindowConsumer(t *testing.T, b *windowBundle, url string) *deliver.Consumer {
	t.Helper()
	c, err := deliver.New(b.js, deliver.Config{}, sub("replayed", url))
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	return c
}

func idsOf(reqs []request) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.header.Get(wire.HeaderIdempotencyKey))
	}
	return out
}

// A replay by time re-delivers exactly the window's events of the
// subscription, signed, in stream order, and leaves its durable consumer
// as it was; --stream and --match narrow it; a dry run counts.
func TestReplayWindowRedeliversExactlyTheWindow(t *testing.T) {
	t.Parallel()
	b := setupWindow(t)
	rc := newReceiver(t, status(http.StatusNoContent))
	c := newWindowConsumer(t, b, rc.URL)
	before := b.info(t, "replayed")

	var progress []int
	res, err := deliver.ReplayWindow(b.ctx, c, "replayed", deliver.Window{Since: b.since, Until: b.until,
		Progress: func(r deliver.WindowResult) { progress = append(progress, r.Delivered) }})
	require.NoError(t, err)
	reqs := rc.requests()
	require.Equal(t, b.in, idsOf(reqs), "the window's events, in stream order")
	require.Equal(t, deliver.WindowResult{Subscription: "replayed", Matched: 5, Delivered: 5, Last: res.Last}, res)
	require.Equal(t, b.in[4], res.Last.EventID)
	require.Equal(t, "order-1", res.Last.Stream)
	require.Equal(t, []int{1, 2, 3, 4, 5}, progress)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	for _, r := range reqs {
		require.NoError(t, v.Verify(r.header, r.body), "signed as a delivery")
		require.Equal(t, r.header.Get(wire.HeaderIdempotencyKey), r.header.Get(webhook.HeaderWebhookID))
	}
	ev, err := b.js.Stream(b.ctx, "EVENTS")
	require.NoError(t, err)
	ephemeral := 0
	for name := range ev.ConsumerNames(b.ctx).Name() {
		if name != "replayed" {
			ephemeral++
		}
	}
	require.Zero(t, ephemeral, "the replay's ordered consumer is gone")
	after := b.info(t, "replayed")
	require.Equal(t, before.Delivered, after.Delivered, "the durable consumer untouched")
	require.Equal(t, before.AckFloor, after.AckFloor)
	require.Equal(t, before.NumPending, after.NumPending)

	t.Run("stream", func(t *testing.T) {
		rc := newReceiver(t, status(http.StatusNoContent))
		res, err := deliver.ReplayWindow(b.ctx, newWindowConsumer(t, b, rc.URL), "replayed", deliver.Window{Since: b.since, Until: b.until, Stream: "order-2"})
		require.NoError(t, err)
		require.Equal(t, b.inStream["order-2"], idsOf(rc.requests()))
		require.Equal(t, 2, res.Delivered)
	})
	t.Run("match", func(t *testing.T) {
		rc := newReceiver(t, status(http.StatusNoContent))
		res, err := deliver.ReplayWindow(b.ctx, newWindowConsumer(t, b, rc.URL), "replayed", deliver.Window{Since: b.since, Until: b.until, Match: regexp.MustCompile(`-1$`)})
		require.NoError(t, err)
		require.Equal(t, b.inStream["order-1"], idsOf(rc.requests()), "order-1 only: invoice-1 is not the subscription's")
		require.Equal(t, 3, res.Delivered)
	})
	t.Run("dry run", func(t *testing.T) {
		rc := newReceiver(t, status(http.StatusNoContent))
		res, err := deliver.ReplayWindow(b.ctx, newWindowConsumer(t, b, rc.URL), "replayed", deliver.Window{Since: b.since, Until: b.until, DryRun: true})
		require.NoError(t, err)
		require.Equal(t, 5, res.Matched)
		require.Zero(t, res.Delivered)
		require.Zero(t, rc.count(), "nothing sent")
	})
	t.Run("ordered subscription", func(t *testing.T) {
		rc := newReceiver(t, status(http.StatusNoContent))
		c, err := deliver.New(b.js, deliver.Config{Partitions: 4}, orderedSub("replayed-ordered", rc.URL))
		require.NoError(t, err)
		require.NoError(t, c.Provision(b.ctx))
		res, err := deliver.ReplayWindow(b.ctx, c, "replayed-ordered", deliver.Window{Since: b.since, Until: b.until})
		require.NoError(t, err)
		require.Equal(t, 5, res.Delivered)
		require.Equal(t, b.in, idsOf(rc.requests()), "read from the events stream, in its order")
		for p := range 4 {
			cons, err := b.js.Consumer(b.ctx, wire.OrderedStream("EVENTS"), wire.PartitionDurable("replayed-ordered", p))
			require.NoError(t, err)
			require.Zero(t, cons.CachedInfo().Delivered.Stream, "partition %d's durable consumer untouched", p)
		}
	})
	t.Run("no until", func(t *testing.T) {
		rc := newReceiver(t, status(http.StatusNoContent))
		res, err := deliver.ReplayWindow(b.ctx, newWindowConsumer(t, b, rc.URL), "replayed", deliver.Window{Since: b.since})
		require.NoError(t, err)
		require.Equal(t, 7, res.Delivered, "the window's five and the two after it")
		require.Equal(t, b.in, idsOf(rc.requests())[:5])
	})
}

// A POST not answered 2xx stops the replay at that event, nothing after it
// sent; the same replay from the failed event's time resumes there.
func TestReplayWindowStopsAtAFailureAndResumesFromIt(t *testing.T) {
	t.Parallel()
	b := setupWindow(t)
	var down atomic.Bool
	down.Store(true)
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if down.Load() && r.Header.Get(wire.HeaderIdempotencyKey) == b.in[2] {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	c := newWindowConsumer(t, b, rc.URL)
	res, err := deliver.ReplayWindow(b.ctx, c, "replayed", deliver.Window{Since: b.since, Until: b.until})
	require.NoError(t, err, "a failed POST is in the result, not an error")
	require.Equal(t, 2, res.Delivered)
	require.NotNil(t, res.Failed)
	require.Equal(t, b.in[2], res.Failed.EventID)
	require.Equal(t, http.StatusServiceUnavailable, res.Failed.Status)
	require.Equal(t, "HTTP 503 Service Unavailable", res.Failed.Reason)
	require.Equal(t, b.in[:3], idsOf(rc.requests()), "nothing sent after the failed event")

	down.Store(false)
	res, err = deliver.ReplayWindow(b.ctx, c, "replayed", deliver.Window{Since: res.Failed.Time, Until: b.until})
	require.NoError(t, err)
	require.Nil(t, res.Failed)
	require.Equal(t, 3, res.Delivered)
	require.Equal(t, append(b.in[:3:3], b.in[2:]...), idsOf(rc.requests()), "resumed at the failed event")
}

func TestReplayWindowRefusesABadWindow(t *testing.T) {
	t.Parallel()
	b := setupWindow(t)
	c := newWindowConsumer(t, b, "http://127.0.0.1:1")
	for name, w := range map[string]deliver.Window{
		"no since":       {},
		"until <= since": {Since: b.until, Until: b.since},
		"stream & match": {Since: b.since, Stream: "order-1", Match: regexp.MustCompile("x")},
	} {
		_, err := deliver.ReplayWindow(b.ctx, c, "replayed", w)
		require.ErrorIs(t, err, deliver.ErrInvalidWindow, name)
	}
	_, err := deliver.ReplayWindow(b.ctx, c, "nope", deliver.Window{Since: b.since})
	require.True(t, errors.Is(err, deliver.ErrUnknownSubscription), "%v", err)
}
