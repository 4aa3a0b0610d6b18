package consumer_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// windowHit is one webhook a replay by time sent.
type windowHit struct {
	id, prev string
}

// windowReceiver is a real endpoint verifying signatures and recording
// each webhook's id and Jsbridge-Previous-Version; it answers 503 to the
// ids in down.
type windowReceiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits []windowHit
	down map[string]bool
	bad  int
}

func newWindowReceiver(t *testing.T, down ...string) *windowReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	rc := &windowReceiver{down: map[string]bool{}}
	for _, id := range down {
		rc.down[id] = true
	}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if err := v.Verify(r.Header, body); err != nil {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		rc.hits = append(rc.hits, windowHit{id: id, prev: r.Header.Get(wire.HeaderPreviousVersion)})
		if rc.down[id] {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// got returns the webhooks whose signature verified.
func (rc *windowReceiver) got() []windowHit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]windowHit(nil), rc.hits...)
}

func (rc *windowReceiver) ids() []string {
	var out []string
	for _, h := range rc.got() {
		out = append(out, h.id)
	}
	return out
}

// Consumer.ReplayWindow under the shared engine, without Start: it reads
// the events stream by direct gets from the window's start to its last
// sequence at the call, POSTs each event signed as a delivery, narrows
// by Stream and Match, counts in a dry run, and stops at a failure that
// the same call from the failed event's time resumes.
func TestSharedEngineReplayWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	b.publishN(t, 0, 10, 2) // ids 1…10: order-0 and order-1, versions 0…4
	events, err := b.js.Stream(b.ctx, wire.DefaultEventsStream)
	require.NoError(t, err)
	fifth, err := events.GetMsg(b.ctx, 5)
	require.NoError(t, err)
	newShared := func(t *testing.T, url string, ordering consumer.Ordering) *consumer.Consumer {
		c, err := consumer.New(b.js, consumer.Config{
			Subscriptions: []consumer.Subscription{sharedSub("replayed", url, ordering)}})
		require.NoError(t, err)
		return c
	}

	rc := newWindowReceiver(t)
	var progress []string
	res, err := newShared(t, rc.srv.URL, consumer.OrderingNone).ReplayWindow(b.ctx, "replayed", consumer.Window{Since: fifth.Time,
		Progress: func(r consumer.WindowResult) { progress = append(progress, r.Last.EventID) }})
	require.NoError(t, err)
	want := []string{"5", "6", "7", "8", "9", "10"}
	require.Equal(t, want, rc.ids(), "the window's events, in stream order")
	require.Equal(t, want, progress)
	require.Equal(t, 6, res.Delivered)
	require.Equal(t, "replayed", res.Subscription, "the result names its subscription (`consumer replay` prints it)")
	require.Equal(t, consumer.WindowPosition{EventID: "10", Seq: 10, Time: res.Last.Time, Stream: "order-1"}, res.Last)
	for _, h := range rc.got() {
		require.Empty(t, h.prev, "an unordered subscription sends no chain")
	}
	rc.mu.Lock()
	require.Zero(t, rc.bad, "requests whose signature did not verify")
	rc.mu.Unlock()

	t.Run("stream and match", func(t *testing.T) {
		rc := newWindowReceiver(t)
		c := newShared(t, rc.srv.URL, consumer.OrderingNone)
		_, err := c.ReplayWindow(b.ctx, "replayed", consumer.Window{Since: fifth.Time, Stream: "order-1"})
		require.NoError(t, err)
		require.Equal(t, []string{"6", "8", "10"}, rc.ids())
		res, err := c.ReplayWindow(b.ctx, "replayed", consumer.Window{Since: fifth.Time, Match: regexp.MustCompile(`-0$`), DryRun: true})
		require.NoError(t, err)
		require.Equal(t, 3, res.Matched)
		require.Zero(t, res.Delivered)
		require.Equal(t, []string{"6", "8", "10"}, rc.ids(), "a dry run sends nothing")
	})
	t.Run("stops at a failure and resumes", func(t *testing.T) {
		rc := newWindowReceiver(t, "7")
		c := newShared(t, rc.srv.URL, consumer.OrderingNone)
		res, err := c.ReplayWindow(b.ctx, "replayed", consumer.Window{Since: fifth.Time})
		require.NoError(t, err)
		require.Equal(t, []string{"5", "6", "7"}, rc.ids(), "nothing after the failure")
		require.NotNil(t, res.Failed)
		require.Equal(t, "7", res.Failed.EventID)
		require.Equal(t, http.StatusServiceUnavailable, res.Failed.Status)
		rc.mu.Lock()
		rc.down = map[string]bool{}
		rc.mu.Unlock()
		res, err = c.ReplayWindow(b.ctx, "replayed", consumer.Window{Since: res.Failed.Time})
		require.NoError(t, err)
		require.Equal(t, []string{"5", "6", "7", "7", "8", "9", "10"}, rc.ids(), "resumed at the failed event")
		require.Equal(t, 4, res.Delivered)
	})
	t.Run("ordered: the chain", func(t *testing.T) {
		// Version 1 of order-0 (id 3) was dead-lettered and not
		// delivered: the stream's first event in the window (id 5,
		// version 2) names version 0; the next ones the one before.
		kv, err := position.Bucket(b.ctx, b.js, "", 1)
		require.NoError(t, err)
		zero := wire.StreamKey(wire.Subject(wire.DefaultEventsPrefix, "order-0", "Placed"))
		require.NoError(t, deadletter.RecordSkipped(b.ctx, kv, "replayed", zero, 1, 0))
		rc := newWindowReceiver(t)
		res, err := newShared(t, rc.srv.URL, consumer.OrderingStream).ReplayWindow(b.ctx, "replayed", consumer.Window{Since: fifth.Time})
		require.NoError(t, err)
		require.Equal(t, 6, res.Delivered)
		prev := map[string]string{}
		for _, h := range rc.got() {
			prev[h.id] = h.prev
		}
		require.Equal(t, map[string]string{"5": "0", "6": "1", "7": "2", "8": "2", "9": "3", "10": "3"}, prev)
	})
	t.Run("bad window, unknown subscription", func(t *testing.T) {
		c := newShared(t, rc.srv.URL, consumer.OrderingNone)
		_, err := c.ReplayWindow(b.ctx, "replayed", consumer.Window{})
		require.ErrorIs(t, err, consumer.ErrInvalidWindow)
		require.ErrorContains(t, err, "Since is required")
		_, err = c.ReplayWindow(b.ctx, "billing", consumer.Window{Since: fifth.Time})
		require.ErrorIs(t, err, consumer.ErrUnknownSubscription)
	})
}
