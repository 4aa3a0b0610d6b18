package forward_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// A cycle of many streams, one event each, whose positions the Forwarder
// knows: every stream is stored in order, each event answered by one
// PubAck, with or without fast batches on the JetStream stream; a stream
// changed behind the Forwarder's back is refused (ErrConflict) without
// affecting the others, and is stored once the drain retries it.
func TestHandleSendsKnownStreamsAhead(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("allow_batched=%v", batched), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			if batched {
				_, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
				require.NoError(t, err)
			} else {
				_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{"events.>"}})
				require.NoError(t, err)
			}
			const streams = 6
			evs := make([][]event.Event, streams)
			first := make([]drain.Batch, streams)
			for s := range evs {
				evs[s] = events(fmt.Sprintf("order-%d", s), int64(100*s+1), 4)
				first[s] = drain.Batch{Stream: evs[s][0].Stream, Events: evs[s][:1], Watermark: -1}
			}
			for _, r := range b.fwd.Handle(t.Context(), first) {
				require.Equal(t, drain.Result{Done: 1}, r)
			}

			// Another publisher stores order-2's version 1 behind the
			// Forwarder's back, outside the duplicate window.
			storeOutsideWindow(t, b.js, evs[2][1:2])
			for round := 1; round < 4; round++ {
				cycle := make([]drain.Batch, streams)
				for s := range cycle {
					cycle[s] = drain.Batch{Stream: evs[s][0].Stream, Events: evs[s][round : round+1], Watermark: int64(round - 1)}
				}
				if round > 1 {
					cycle = append(cycle[:2], cycle[3:]...) // order-2 waits for its retry
				}
				n := answers(b, func() {
					res := b.fwd.Handle(t.Context(), cycle)
					for i, r := range res {
						if round == 1 && i == 2 {
							require.Equal(t, 0, r.Done)
							require.ErrorIs(t, r.Err, forward.ErrConflict)
							continue
						}
						require.Equal(t, drain.Result{Done: 1}, r, "stream %s, round %d", cycle[i].Stream, round)
					}
				})
				require.Equal(t, uint64(len(cycle)), n, "one PubAck a stream")
			}
			// The drain retries order-2 (Reconcile): version 1 is found
			// stored, the rest published.
			res := b.fwd.Handle(t.Context(), []drain.Batch{{Stream: "order-2", Events: evs[2][1:], Watermark: 0, Retry: 1, Reconcile: true}})
			require.Equal(t, drain.Result{Done: 3}, res[0])
			for s := range evs {
				want := []string{}
				for _, e := range evs[s] {
					want = append(want, event.FormatID(e.ID))
				}
				require.Equal(t, want, ids(b.stored(t, fmt.Sprintf("events.order.order-%d.", s))), "stream order-%d in order, once", s)
			}
		})
	}
}

// A single event sent ahead whose Nats-Msg-Id JetStream already holds
// within its duplicate window is a duplicate, not a failure, and the
// stream goes on from the message the expectation named.
func TestHandleAheadDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &countingObserver{}
	f := newForwarder(t, b.js, obs)
	evs := events("order-1", 1, 3)
	require.Equal(t, drain.Result{Done: 1}, f.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[:1], Watermark: -1}})[0])
	// The next version carries the id of the event already stored: the
	// same Nats-Msg-Id.
	dup := evs[1]
	dup.ID = evs[0].ID
	require.Equal(t, drain.Result{Done: 1}, f.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: []event.Event{dup}, Watermark: 0}})[0])
	require.Equal(t, drain.Result{Done: 1}, f.Handle(t.Context(), []drain.Batch{{Stream: "order-1", Events: evs[2:], Watermark: 1}})[0])
	require.Equal(t, []string{"1", "3"}, ids(b.stored(t, "events.")))
	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Equal(t, []forward.Status{forward.Stored, forward.Duplicate, forward.Stored}, obs.sent)
}
