package consumer_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// chainReceiver is a real endpoint verifying every request's signature
// and, per path and stream, the version chain: each webhook's
// Jsbridge-Previous-Version names the last version it accepted of the
// stream ("none" before the first). It refuses (422, permanent) the
// event ids in refuse until fixed.
type chainReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	refuse   map[string]bool
	versions map[string][]int64 // path → versions accepted, in order
	ids      map[string]map[string]bool
	breaks   []string
	bad      int
}

func newChainReceiver(t *testing.T, refuse ...string) *chainReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	rc := &chainReceiver{refuse: map[string]bool{}, versions: map[string][]int64{}, ids: map[string]map[string]bool{}}
	for _, id := range refuse {
		rc.refuse[id] = true
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
		if rc.refuse[id] {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		path := r.URL.Path
		if rc.ids[path] == nil {
			rc.ids[path] = map[string]bool{}
		}
		if rc.ids[path][id] {
			w.WriteHeader(http.StatusNoContent) // a duplicate
			return
		}
		ver, _ := strconv.ParseInt(r.Header.Get(wire.HeaderStreamVersion), 10, 64)
		if prev := r.Header.Get(wire.HeaderPreviousVersion); prev != "" {
			want := wire.PreviousNone
			if vs := rc.versions[path]; len(vs) > 0 {
				want = strconv.FormatInt(vs[len(vs)-1], 10)
			}
			if prev != want {
				rc.breaks = append(rc.breaks, fmt.Sprintf("%s: version %d names %s, want %s", path, ver, prev, want))
			}
		}
		rc.ids[path][id] = true
		rc.versions[path] = append(rc.versions[path], ver)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *chainReceiver) fix() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.refuse = map[string]bool{}
}

func (rc *chainReceiver) accepted(path string) []int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]int64(nil), rc.versions[path]...)
}

// parkedSetup runs a shared-engine Consumer with an ordered subscription
// parking its streams (/ordered) and an unordered one (/unordered) on one
// receiver refusing event 4 (version 3 of stream order-0, ten events),
// and waits until both dead-lettered it and the ordered one's stream is
// parked at it.
func parkedSetup(t *testing.T, reg *prometheus.Registry) (bundle, *chainReceiver, *consumer.Consumer, map[string]consumer.DeadLetter) {
	t.Helper()
	b := setup(t)
	b.createEvents(t)
	rc := newChainReceiver(t, "4")
	ordered := sharedSub("ordered", rc.srv.URL, consumer.OrderingStream)
	ordered.OnDeadLetter = consumer.DeadLetterPark
	c, err := consumer.New(b.js, consumer.Config{Partitions: 2, LeaseTTL: 2 * time.Second, Registerer: reg,
		ReplicaID: "replica-a", Subscriptions: []consumer.Subscription{ordered, sharedSub("unordered", rc.srv.URL, consumer.OrderingNone)}})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.publishN(t, 0, 10, 1)

	letters := map[string]consumer.DeadLetter{}
	require.Eventually(t, func() bool {
		all, err := c.DeadLetters().List(b.ctx, "")
		require.NoError(t, err)
		for _, dl := range all {
			letters[dl.Subscription] = dl
		}
		return len(letters) == 2 && len(rc.accepted("/unordered")) == 9
	}, 20*time.Second, 10*time.Millisecond, "event 4 dead-lettered by both subscriptions")
	dl := letters["ordered"]
	require.Equal(t, "4", dl.EventID)
	require.Equal(t, "2", dl.PreviousVersion, "the letter keeps its chain header")
	kv, err := shared.PositionsBucket(b.ctx, b.js, "")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		parked, err := shared.ParkedHead(b.ctx, kv, "ordered", wire.StreamKey(dl.Subject), dl.StreamSeq)
		require.NoError(t, err)
		return parked
	}, 10*time.Second, 10*time.Millisecond, "the ordered stream parked at its head in the partition's record")
	require.Equal(t, []int64{0, 1, 2}, rc.accepted("/ordered"), "nothing after the parked head")
	parked, err := c.DeadLetters().Parked(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, parked, 1, "dlq list shows the parked stream")
	require.Equal(t, consumer.ParkedStream{Subscription: "ordered", Stream: "order-0", Subject: dl.Subject, HeadEventID: "4",
		HeadVersion: "3", Partition: parked[0].Partition, ParkedAt: dl.DeadLetteredAt, Reason: dl.Reason}, parked[0])
	return b, rc, c, letters
}

// Under the shared engine, `dlq replay` of a parked stream's head POSTs
// it (signed, its chain header) and has the partition's owner read the
// stream's held events again: all of them follow in order, the chain
// unbroken; an unordered subscription's letter is POSTed and removed.
func TestSharedEngineReplayParkedHead(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a shared engine and waits for a park and an unpark")
	}
	t.Parallel()
	reg := prometheus.NewRegistry()
	b, rc, c, letters := parkedSetup(t, reg)
	rc.fix()
	for _, res := range c.Replay(b.ctx, []consumer.DeadLetter{letters["ordered"], letters["unordered"]}) {
		require.NoError(t, res.Err, "replay of %s", res.Letter.Subscription)
		require.True(t, res.Delivered)
		require.Equal(t, http.StatusNoContent, res.Status)
	}
	require.Eventually(t, func() bool { return len(rc.accepted("/ordered")) == 10 }, 20*time.Second, 10*time.Millisecond,
		"the stream's held events follow the replayed head")
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, rc.accepted("/ordered"))
	require.Len(t, rc.accepted("/unordered"), 10)
	rc.mu.Lock()
	require.Empty(t, rc.breaks, "the version chain")
	require.Zero(t, rc.bad, "requests whose signature did not verify")
	rc.mu.Unlock()
	n, err := c.DeadLetters().Count(b.ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "both letters removed")
	require.Equal(t, 1.0, promregtest.Value(t, reg, "jsbridge_consumer_dead_letters_replayed_total", "subscription", "ordered"))
	require.Equal(t, 1.0, promregtest.Value(t, reg, "jsbridge_consumer_dead_letters_replayed_total", "subscription", "unordered"))
}

// Under the shared engine, `dlq skip` of a parked stream's head POSTs
// nothing and lets the stream go on: its next event names the head's
// own predecessor, the chain unbroken at the receiver.
func TestSharedEngineSkipParkedHead(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a shared engine and waits for a park and an unpark")
	}
	t.Parallel()
	b, rc, c, letters := parkedSetup(t, prometheus.NewRegistry())
	rc.fix()
	require.NoError(t, c.DeadLetters().Skip(b.ctx, letters["ordered"]))
	require.Eventually(t, func() bool { return len(rc.accepted("/ordered")) == 9 }, 20*time.Second, 10*time.Millisecond,
		"the stream's held events follow the skipped head")
	require.Equal(t, []int64{0, 1, 2, 4, 5, 6, 7, 8, 9}, rc.accepted("/ordered"), "the head not sent")
	rc.mu.Lock()
	require.Empty(t, rc.breaks, "version 4 names 2, the head's predecessor")
	rc.mu.Unlock()
	_, err := c.DeadLetters().Get(b.ctx, letters["ordered"].Seq)
	require.ErrorIs(t, err, consumer.ErrDeadLetterNotFound, "the skipped letter deleted")
	require.ErrorIs(t, c.DeadLetters().Skip(b.ctx, letters["unordered"]), consumer.ErrNotParked, "an unordered letter parks nothing")
}

// Under the shared engine, the library's DeadLetters.Unpark lets a
// parked stream go on as skip does (nothing POSTed, its next event
// naming the head's own predecessor) but keeps the head's letter.
func TestSharedEngineUnparkParkedHead(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a shared engine and waits for a park and an unpark")
	}
	t.Parallel()
	b, rc, c, letters := parkedSetup(t, prometheus.NewRegistry())
	rc.fix()
	require.NoError(t, c.DeadLetters().Unpark(b.ctx, letters["ordered"]))
	require.Eventually(t, func() bool { return len(rc.accepted("/ordered")) == 9 }, 20*time.Second, 10*time.Millisecond,
		"the stream's held events follow the unparked head")
	require.Equal(t, []int64{0, 1, 2, 4, 5, 6, 7, 8, 9}, rc.accepted("/ordered"), "the head not sent")
	rc.mu.Lock()
	require.Empty(t, rc.breaks, "version 4 names 2, the head's predecessor")
	rc.mu.Unlock()
	kept, err := c.DeadLetters().Get(b.ctx, letters["ordered"].Seq)
	require.NoError(t, err, "the unparked head's letter stays")
	require.Equal(t, "4", kept.EventID)
	parked, err := c.DeadLetters().Parked(b.ctx, "")
	require.NoError(t, err)
	require.Empty(t, parked, "no stream parked any more")
	require.ErrorIs(t, c.DeadLetters().Unpark(b.ctx, letters["ordered"]), consumer.ErrNotParked, "unparked already")
	require.ErrorIs(t, c.DeadLetters().Unpark(b.ctx, letters["unordered"]), consumer.ErrNotParked, "an unordered letter parks nothing")
}
