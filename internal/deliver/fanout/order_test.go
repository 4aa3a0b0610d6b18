package fanout

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// A stream set aside for a subscription that then leaves the shared read
// (its breaker, here) keeps write before next: the cursor's floor passed
// the aside's events unsettled, and its lane sends the stream's next
// version only once the commit covering the previous one succeeded. The
// owner is replaced as the next version goes out, before any other
// commit: the next owner, reading the stream from the record, sends none
// of the versions before it again (the killed-replicas test saw 37 and
// 38 sent again after 39).
func TestAStreamSetAsideKeepsWriteBeforeNextWhileItsSubscriptionHasACursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true})
	evs := []reader.Event{event(1, "order-0", 0), event(2, "order-1", 0), event(3, "order-0", 1), event(4, "order-0", 2),
		event(5, "order-0", 3), event(6, "order-1", 1), event(7, "order-0", 4)}
	st := &store{}
	st.add(evs...)
	// The fan-out's clock alone moves; the commit loop's (b.clock) never
	// does: a commit goes only for a waiter or a Flush.
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	head, hold, next, gone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	first := newRecorder(func(d Delivery) Settlement {
		switch d.Event.Seq {
		case 1:
			select {
			case <-head:
			default:
				return Settlement{Act: Retry, Delay: 10 * time.Second}
			}
		case 3:
			<-hold
		case 4:
			close(next)
			<-gone // its answer is lost with the owner
			return Settlement{Act: Retry, Delay: time.Minute}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos, first, nil, st)
	t.Cleanup(f.Close)
	for _, e := range evs {
		f.Dispatch(e)
	}
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
	clock.Advance(time.Second)
	eventually(t, func() bool { return f.Floor() == 7 }, "order-0 set aside from its head 1")
	close(head)
	clock.Advance(10 * time.Second)
	eventually(t, func() bool {
		_, err := f.CatchUp(t.Context())
		require.NoError(t, err)
		f.mu.Lock()
		defer f.mu.Unlock()
		l := f.subs["s"].lanes["events.order.order-0"]
		return l != nil && len(l.q) == 4
	}, "head 1 settled, the stream read again: 3 in flight, 4, 5, 7 queued")

	require.NoError(t, f.SetState("s", StateBreaker))
	require.NoError(t, pos.Flush(t.Context()))
	require.Equal(t, uint64(7), pos.Cursors()["s"].Floor, "the cursor's floor passed the aside")
	close(hold)
	<-next // 3 settled, 4 goes out: replaced now
	pos2, _ := b.claim(t, "replica-b", 2)
	close(gone)
	f.Close()

	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.NoError(t, f2.SetState("s", ""))
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && slices.Contains(second.seqs("s"), 7)
	}, "the next owner sends the rest of order-0")
	require.Equal(t, []uint64{4, 5, 7}, second.seqs("s"), "4 again (the latest sent), none before it")
}

// A next owner does not rejoin a stream set aside for a subscription
// that has a cursor, however far the aside's reads are: the cursor's
// floor passed the aside's events unsettled, so the aside alone still
// covers them, and the stream is read from its head once the
// subscription is live again. Before, the aside's head above the
// record's floor (the floor held back by other events) made the next
// owner's first CatchUp, its head still at the floor, drop the aside:
// the cursor's read went on above the aside's events, never sent.
func TestANextOwnerKeepsAnAsideWhoseSubscriptionHasACursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 10, 2) // order-0: 1, 3, 5, 7, 9; order-1: 2, 4, 6, 8, 10
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	pos.Edit(func(r *position.Record) {
		r.Floor, r.Members["s"] = 3, 3
		r.Asides = []position.Aside{{Sub: "s", Stream: "events.order.order-0", From: 5, State: AsideStuck}}
	})
	require.True(t, pos.Detach("s", StateBehind))
	require.True(t, pos.EditCursor("s", func(c *position.Cursor) { c.Floor = 8 }))
	require.NoError(t, pos.Flush(t.Context()))
	stop()

	pos2, _ := b.claim(t, "replica-b", 2)
	rec := newRecorder(nil)
	f := New(Config{Archetype: base.New(clockwork.NewFakeClock(), nil, "")}, idx, pos2, rec, nil, st)
	t.Cleanup(f.Close)
	_, err := f.CatchUp(t.Context()) // the loop's first round, before any event: the head is the floor
	require.NoError(t, err)
	for _, e := range evs[3:] {
		f.Dispatch(e)
	}
	catchUp(t, f)
	eventually(t, func() bool { return len(rec.seqs("s")) == 4 }, "the cursor's events and the aside's")
	inOrder(t, rec.of("s"), []reader.Event{evs[4], evs[6], evs[8], evs[9]})
	require.Empty(t, pos2.Record().Asides, "the stream rejoined once read")
}

// An ordered subscription's streams are not bounded by the partition:
// every stream's head goes to the Sender at once, which bounds the POSTs
// (the replica's max_in_flight slots, oldest event first). A bound here,
// first come first served, queued a busy stream's next version behind
// the other streams' events (issue 33).
func TestOrderedStreamsHeadsAllReachTheSender(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	var running atomic.Int32
	proceed := make(chan struct{})
	rec := newRecorder(func(Delivery) Settlement {
		running.Add(1)
		<-proceed
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "o", Filters: []string{"events.>"}, Ordered: true, MaxInFlight: 1}), pos, rec, nil, nil)
	t.Cleanup(f.Close)
	for _, e := range events(1, 8, 4) {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return running.Load() == 4 }, "the four streams' heads are with the Sender at once")
	close(proceed)
	eventually(t, func() bool { return len(rec.seqs("o")) == 8 }, "every event settles")
}
