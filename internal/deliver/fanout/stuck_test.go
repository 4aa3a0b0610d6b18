package fanout

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// A head retried in place for 1 s does not set its stream aside with 3
// events queued behind it, and does with the 4th: the queued events
// leave its lane, the floor passes the stream, the other streams go on.
// Once the head settles, the stream's later events are read again and
// go out in order, the chain unbroken, and the stream rejoins the shared
// read.
func TestAStuckStreamIsSetAsideAndRejoinsAfterItsHeadSettles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock() // the fan-out's alone: its sleepers are the lanes'
	release := make(chan struct{})
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 1 {
			select {
			case <-release:
			default:
				return Settlement{Act: Retry, Delay: 10 * time.Second}
			}
		}
		return Settlement{Act: Delivered}
	})
	st := &store{}
	f := New(Config{Archetype: base.New(clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, st)
	t.Cleanup(f.Close)
	evs := []reader.Event{event(1, "order-0", 0), event(2, "order-1", 0), event(3, "order-0", 1), event(4, "order-0", 2),
		event(5, "order-0", 3), event(6, "order-1", 1), event(7, "order-0", 4)}
	st.add(evs...)
	for _, e := range evs[:6] {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(rec.seqs("s")) == 2 }, "the other stream goes on")
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
	clock.Advance(time.Second)
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1)) // it looked, and waits again
	require.Empty(t, pos.Record().Asides, "3 queued behind the head: not yet")
	require.Zero(t, f.Floor(), "the head holds the floor back")

	f.Dispatch(evs[6])
	stuck := "events.order.order-0"
	require.Equal(t, []position.Aside{{Sub: "s", Stream: stuck, From: 1, State: AsideStuck}}, pos.Record().Asides, "the 4th sets it aside")
	eventually(t, func() bool { return f.Floor() == 7 }, "the floor passes the stuck stream")

	close(release)
	clock.Advance(10 * time.Second)
	eventually(t, func() bool {
		n, err := f.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(rec.seqs("s")) == 7
	}, "the head settles, the stream's later events go out and it rejoins")
	var got []sent
	for _, s := range rec.of("s") {
		if s.stream == stuck {
			got = append(got, s)
		}
	}
	require.Equal(t, []sent{{1, stuck, NoPrevious}, {3, stuck, 0}, {4, stuck, 1}, {5, stuck, 2}, {7, stuck, 3}}, got, "in order, the chain unbroken")
	require.Empty(t, pos.Record().Asides)
	f.Dispatch(event(8, "order-0", 5))
	eventually(t, func() bool { return len(rec.seqs("s")) == 8 }, "the stream is live again")
	require.Equal(t, sent{8, stuck, 4}, rec.of("s")[7])
}

// A head retried in place for 5 s sets its stream aside whatever is
// queued behind it: no head holds the floor back longer.
func TestAHeadRetriedFiveSecondsSetsItsStreamAside(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 1 {
			return Settlement{Act: Retry, Delay: time.Minute}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, &store{})
	t.Cleanup(f.Close)
	f.Dispatch(event(1, "order-0", 0))
	f.Dispatch(event(2, "order-0", 1))
	for range 2 { // it looks at 1 s (one queued: not yet), then at 5 s
		require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
		require.Empty(t, pos.Record().Asides)
		clock.Advance(clock.Until(clock.Now().Add(4 * time.Second)))
	}
	eventually(t, func() bool { return len(pos.Record().Asides) == 1 }, "set aside at 5 s")
	require.Equal(t, position.Aside{Sub: "s", Stream: "events.order.order-0", From: 1, State: AsideStuck}, pos.Record().Asides[0])
	eventually(t, func() bool { return f.Floor() == 2 }, "the floor passes it")
}

// A stream a former owner set aside as stuck is the next owner's to read
// from its head on: the head and the stream's later events go out in
// order, and the stream rejoins the shared read.
func TestAStuckStreamIsReadFromItsHeadByTheNextOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 6, 2) // order-0: 1, 3, 5; order-1: 2, 4, 6
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	first := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 1 {
			return Settlement{Act: Retry, Delay: time.Minute}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs {
		f.Dispatch(e)
	}
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
	clock.Advance(5 * time.Second)
	eventually(t, func() bool { return f.Floor() == 6 }, "set aside, the stream no longer holds the floor")
	f.Close()
	stop()

	pos2, _ := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(second.seqs("s")) == 3
	}, "the next owner reads the stream from its head and it rejoins")
	require.Equal(t, []sent{{1, "events.order.order-0", NoPrevious}, {3, "events.order.order-0", 0}, {5, "events.order.order-0", 1}}, second.of("s"))
	require.Empty(t, pos2.Record().Asides)
}
