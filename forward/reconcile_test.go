package forward_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// countingObserver counts the events a Forwarder actually sent.
type countingObserver struct {
	mu    sync.Mutex
	sent  []forward.Status
	after func(o forward.Outcome) // called after each publish, in the publishing goroutine
}

func (c *countingObserver) Published(o forward.Outcome, _ time.Duration) {
	c.mu.Lock()
	c.sent = append(c.sent, o.Status)
	after := c.after
	c.mu.Unlock()
	if after != nil {
		after(o)
	}
}

func (c *countingObserver) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

// storeOutsideWindow stores evs in JetStream as the forwarder would, but
// without Nats-Msg-Id: as if they were published longer ago than the
// duplicate window, so JetStream's dedup cannot drop a re-publish.
func storeOutsideWindow(t *testing.T, js jetstream.JetStream, evs []event.Event) {
	t.Helper()
	for _, e := range evs {
		m := forward.Message(e, forward.Config{})
		m.Header.Del(wire.HeaderMsgID)
		_, err := js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
}

// newForwarder returns a second Forwarder on the same JetStream: another
// bridge, which has published nothing itself.
func newForwarder(t *testing.T, js jetstream.JetStream, obs forward.Observer) *forward.Forwarder {
	t.Helper()
	f, err := forward.New(js, forward.Config{Observer: obs})
	require.NoError(t, err)
	return f
}

func TestHandleReconcileSkipsStoredEvents(t *testing.T) {
	t.Parallel()
	for _, direct := range []bool{false, true} {
		t.Run(map[bool]string{false: "api", true: "direct-get"}[direct], func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
				Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}, AllowDirect: direct,
			})
			require.NoError(t, err)
			evs := events("order-1", 100, 6)
			// A bridge died after storing 4 events, long ago; another stream
			// shares the category and must not confuse the lookup.
			storeOutsideWindow(t, b.js, evs[:4])
			storeOutsideWindow(t, b.js, events("order-10", 900, 5))

			obs := &countingObserver{}
			res := newForwarder(t, b.js, obs).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs, Reconcile: true}})
			require.Equal(t, drain.Result{Done: 6}, res[0])
			require.Equal(t, 2, obs.count(), "only the events JetStream lacked were sent")
			require.Equal(t, []string{"100", "101", "102", "103", "104", "105"}, ids(b.stored(t, "events.order.order-1.")))
		})
	}
}

func TestPublishReconcileStatusAndResumePastZero(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 5)
	storeOutsideWindow(t, b.js, evs[:3])
	// No Reconcile flag, but this forwarder never published the stream and
	// the batch resumes at version 2: it looks before it publishes.
	out := newForwarder(t, b.js, nil).Publish(t.Context(), evs[2:])
	require.Equal(t, forward.AlreadyStored, out[0].Status)
	require.Equal(t, "already_stored", out[0].Status.String())
	require.Equal(t, forward.Stored, out[1].Status)
	require.Equal(t, forward.Stored, out[2].Status)
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, ids(b.stored(t, "events.")))
}

// JetStream lost the tail of a stream the bridge had forwarded (a crash
// before its periodic fsync, or a delete): its last message is below the
// watermark. Publishing on would leave a hole no re-publish can fill in
// order, so the batch fails non-retryable (the stream blocks) and sends
// nothing; once the tail is back, the same batch goes through.
func TestHandleRefusesToPublishPastEventsJetStreamLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 8)
	storeOutsideWindow(t, b.js, evs[:3]) // versions 0-2 survived; 3 and 4 were forwarded, then lost

	obs := &countingObserver{}
	res := newForwarder(t, b.js, obs).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Watermark: 4, Events: evs[5:]}})
	require.Equal(t, 0, res[0].Done)
	require.True(t, drain.IsNonRetryable(res[0].Err), "%v", res[0].Err)
	require.ErrorIs(t, res[0].Err, forward.ErrLostInJetStream)
	require.ErrorContains(t, res[0].Err, "bridge verify --repair --stream order-1")
	require.Equal(t, []string{"1", "2", "3"}, ids(b.stored(t, "events.")), "nothing published past the hole")

	storeOutsideWindow(t, b.js, evs[3:5]) // the repair
	res = newForwarder(t, b.js, obs).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Watermark: 4, Events: evs[5:]}})
	require.Equal(t, drain.Result{Done: 3}, res[0])
	require.Equal(t, []string{"1", "2", "3", "4", "5", "6", "7", "8"}, ids(b.stored(t, "events.")))
}

func TestHandleFromVersionZeroWithoutReconcileRepublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 3)
	storeOutsideWindow(t, b.js, evs)
	// A reset stream starts again at version 0 without Reconcile: every
	// event is published again (only the duplicate window could drop them).
	res := newForwarder(t, b.js, nil).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs}})
	require.Equal(t, drain.Result{Done: 3}, res[0])
	require.Equal(t, []string{"1", "2", "3", "1", "2", "3"}, ids(b.stored(t, "events.")))
}

func TestZombieForwarderIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 6)
	zombie := newForwarder(t, b.js, nil)
	require.Equal(t, drain.Result{Done: 3}, zombie.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:3]}})[0])

	// The zombie's lease expired before it acked; another bridge took over
	// and stored the rest, longer ago than the duplicate window.
	storeOutsideWindow(t, b.js, evs[3:])

	// The zombie wakes up and goes on where it left off: refused, and
	// nothing stored.
	res := zombie.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[3:]}})
	require.Equal(t, 0, res[0].Done)
	require.ErrorIs(t, res[0].Err, forward.ErrConflict)
	require.False(t, drain.IsNonRetryable(res[0].Err))
	require.False(t, drain.IsUnavailable(res[0].Err), "a conflict is not an outage")
	require.Equal(t, forward.ClassConflict, forward.ErrorClass(res[0].Err))
	require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, ids(b.stored(t, "events.")))
}

func TestZombieForwarderInsideWindowStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 6)
	zombie := newForwarder(t, b.js, nil)
	require.Equal(t, drain.Result{Done: 3}, zombie.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:3]}})[0])

	// Another bridge takes over and stores the rest within the window.
	res := newForwarder(t, b.js, nil).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs, Reconcile: true}})
	require.Equal(t, drain.Result{Done: 6}, res[0])

	// The zombie's re-publish is refused (one at a time: the expectation)
	// or dropped as duplicates (a fast batch): either way nothing is
	// stored twice; its lease, not the publish, stops it from settling.
	zombie.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[3:]}})
	require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, ids(b.stored(t, "events.")))
}

func TestHandleConflictMidBatchKeepsOrder(t *testing.T) {
	t.Parallel()
	// One event at a time (no fast batches): each publish carries the
	// expectation, so a change behind the forwarder's back between two of
	// them is refused.
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}})
	require.NoError(t, err)
	evs := events("order-1", 1, 6)
	// Right after event 3 (version 2) is stored, another publisher stores
	// event 4 behind the forwarder's back, outside the duplicate window.
	var once sync.Once
	obs := &countingObserver{}
	obs.after = func(o forward.Outcome) {
		if o.Status == forward.Stored && o.Sequence == 3 {
			once.Do(func() { storeOutsideWindow(t, b.js, evs[3:4]) })
		}
	}
	f := newForwarder(t, b.js, obs)
	res := f.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs}})
	require.Equal(t, 3, res[0].Done)
	require.ErrorIs(t, res[0].Err, forward.ErrConflict)
	require.ErrorContains(t, res[0].Err, "event 4")
	require.Equal(t, []string{"1", "2", "3", "4"}, ids(b.stored(t, "events.")), "nothing after the refused event was sent")

	// The drain retries from the watermark (version 2) with Reconcile set.
	res = f.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Retry: 1, Reconcile: true, Events: evs[3:]}})
	require.Equal(t, drain.Result{Done: 3}, res[0])
	require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, ids(b.stored(t, "events.")))
}

func TestHandleRetryAfterMidBatchRejectionKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxPayload: 4096, stream: &forward.StreamConfig{}})
	evs := events("order-1", 1, 5)
	big := evs[2].Data
	evs[2].Data = []byte(`{"big":"` + strings.Repeat("x", 5000) + `"}`)
	res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs}})
	require.Equal(t, 2, res[0].Done)
	require.ErrorIs(t, res[0].Err, forward.ErrTooLarge)

	// An operator fixes the event and unblocks: the retry goes on in order.
	evs[2].Data = big
	res = b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Retry: 1, Reconcile: true, Events: evs[2:]}})
	require.Equal(t, drain.Result{Done: 3}, res[0])
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, ids(b.stored(t, "events.")))
}

// BenchmarkHandle publishes one event per Handle call to one stream of a
// JetStream stream holding 2,000 streams: "expect" is the Forwarder (with
// Nats-Expected-Last-Subject-Sequence over the stream's subjects), "plain"
// the same message published without the expectation, "lookup" the
// reconciliation lookup alone.
func BenchmarkHandle(b *testing.B) {
	bb := setup(b)
	ctx := b.Context()
	for i := range 2000 {
		name := "acct-" + strconv.Itoa(i)
		_ = bb.fwd.Publish(ctx, events(name, int64(1_000_000+i*10), 10))
	}
	s, err := bb.js.Stream(ctx, wire.DefaultEventsStream)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("expect", func(b *testing.B) {
		id, v := int64(1), int64(0)
		for b.Loop() {
			e := events("bench-1", id, 1)
			e[0].Version = v
			if r := bb.fwd.Handle(ctx, []drain.Batch{{Stream: "bench-1", Events: e}}); r[0].Err != nil {
				b.Fatal(r[0].Err)
			}
			id, v = id+1, v+1
		}
	})
	b.Run("plain", func(b *testing.B) {
		id := int64(10_000_000)
		for b.Loop() {
			e := events("bench-2", id, 1)
			if _, err := bb.js.PublishMsg(ctx, forward.Message(e[0], forward.Config{})); err != nil {
				b.Fatal(err)
			}
			id++
		}
	})
	b.Run("lookup", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.GetLastMsgForSubject(ctx, wire.StreamFilter("events", "bench-1")); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// EVENTS answers direct gets (Provision turns AllowDirect on for the
// consumer's readers), and any replica may answer one, a lagging
// follower too. Reconciliation asks the stream's leader instead, so a
// lagging replica's older last message is never taken for events
// JetStream lost. The lagging replica is a mirror that stopped at the
// stream's first messages and answers the stream's direct gets at random
// with the stream itself (nats-server's mirror direct, one queue group):
// asked through a direct get, it answers below the watermark about half
// the time.
func TestReconcileAsksTheLeaderNotALaggingReplica(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := events("order-1", 1, 4)
	storeOutsideWindow(t, b.js, evs[:2])
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "EVENTS_LAGGING",
		Mirror: &jetstream.StreamSource{Name: wire.DefaultEventsStream}, MaxMsgs: 2, Discard: jetstream.DiscardNew})
	require.NoError(t, err)
	mirror, err := b.js.Stream(t.Context(), "EVENTS_LAGGING")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := mirror.Info(t.Context())
		return err == nil && info.State.Msgs == 2
	}, 10*time.Second, 20*time.Millisecond)
	storeOutsideWindow(t, b.js, evs[2:]) // versions 2 and 3: the mirror lacks them

	s, err := b.js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	require.True(t, s.CachedInfo().Config.AllowDirect)
	stale := false
	for range 32 {
		m, err := s.GetLastMsgForSubject(t.Context(), wire.StreamFilter(wire.DefaultEventsPrefix, "order-1"))
		require.NoError(t, err)
		stale = stale || m.Header.Get(wire.HeaderStreamVersion) != "3"
	}
	require.True(t, stale, "a direct get is answered by the lagging mirror at times")

	for range 16 {
		obs := &countingObserver{}
		res := newForwarder(t, b.js, obs).Handle(t.Context(), []drain.Batch{{Stream: "order-1", Watermark: 3, Events: evs[2:], Reconcile: true}})
		require.Equal(t, drain.Result{Done: 2}, res[0], "versions 2 and 3 found stored, none taken for lost")
		require.Zero(t, obs.count(), "nothing sent")
	}
}
