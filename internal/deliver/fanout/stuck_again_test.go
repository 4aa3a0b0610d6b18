package fanout

import (
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// gate is a Sender's answer that retries the events at the sequences it
// holds until they are let go, and delivers the others.
type gate struct {
	mu   sync.Mutex
	held map[uint64]bool
}

func newGate(seqs ...uint64) *gate {
	g := &gate{held: map[uint64]bool{}}
	for _, s := range seqs {
		g.held[s] = true
	}
	return g
}

func (g *gate) let(seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, seq)
}

func (g *gate) answer(d Delivery) Settlement {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[d.Event.Seq] {
		return Settlement{Act: Retry, Delay: 10 * time.Second}
	}
	return Settlement{Act: Delivered}
}

// untilAside advances clock, a second at a time while a lane waits on
// it, until asides says a stream is set aside.
func untilAside(t *testing.T, clock *clockwork.FakeClock, asides func() int) {
	t.Helper()
	eventually(t, func() bool {
		if asides() > 0 {
			return true
		}
		if clock.BlockUntilContext(t.Context(), 1) == nil && asides() == 0 {
			clock.Advance(time.Second)
		}
		return asides() > 0
	}, "the stream is set aside")
}

// loop runs the replica's dispatch loop over f until done: a cursor
// round, then the next of evs, if any; it returns how many of evs it
// dispatched.
func loop(t *testing.T, f *Partition, evs []reader.Event, done func(n int) bool) int {
	t.Helper()
	next := 0
	eventually(t, func() bool {
		n, err := f.CatchUp(t.Context())
		require.NoError(t, err)
		if next < len(evs) {
			f.Dispatch(evs[next])
			next++
		}
		return next == len(evs) && done(n)
	}, "the loop's rounds")
	return next
}

// A stream set aside as stuck, its head settled, rejoined, and set aside
// as stuck again a few events later goes on: once its second head
// settles, its later events are read, sent in order, and it rejoins (the
// rolling restart saw a stream's last versions never sent after its
// second aside).
func TestAStreamSetAsideTwiceSendsItsLaterEventsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	evs := events(1, 12, 1) // order-0: seqs 1 … 12, versions 0 … 11
	g := newGate(1, 6)
	rec := newRecorder(g.answer)
	st := &store{}
	st.add(evs...)
	f := New(Config{Archetype: base.New(clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, st)
	t.Cleanup(f.Close)
	asides := func() int { return len(pos.Record().Asides) }

	f.Dispatch(evs[0])
	f.Dispatch(evs[1])
	untilAside(t, clock, asides)
	f.Dispatch(evs[2]) // set aside: the stream's reads bring them
	g.let(1)
	clock.Advance(10 * time.Second)
	loop(t, f, evs[3:5], func(n int) bool { return n == 0 && asides() == 0 && len(rec.seqs("s")) == 5 })

	f.Dispatch(evs[5]) // its head 6 is retried until it is set aside again
	f.Dispatch(evs[6])
	untilAside(t, clock, asides)
	f.Dispatch(evs[7])
	g.let(6)
	clock.Advance(10 * time.Second)
	loop(t, f, evs[8:], func(n int) bool { return n == 0 && asides() == 0 && len(rec.seqs("s")) == len(evs) })
	inOrder(t, rec.of("s"), evs)
}

// The same, with the second aside set by the events queued behind the
// head (Dispatch's look) while the head's attempt is in flight, and
// that attempt settling it.
func TestAStreamSetAsideAgainWhileItsHeadIsInFlightGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	evs := events(1, 14, 1)
	g := newGate(1, 6)
	inFlight, answer := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 6 && d.Attempt == 3 {
			once.Do(func() { close(inFlight) })
			<-answer
			return Settlement{Act: Delivered}
		}
		return g.answer(d)
	})
	st := &store{}
	st.add(evs...)
	f := New(Config{Archetype: base.New(clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, st)
	t.Cleanup(f.Close)
	asides := func() int { return len(pos.Record().Asides) }

	f.Dispatch(evs[0])
	f.Dispatch(evs[1])
	untilAside(t, clock, asides)
	f.Dispatch(evs[2])
	g.let(1)
	clock.Advance(10 * time.Second)
	loop(t, f, evs[3:5], func(n int) bool { return n == 0 && asides() == 0 && len(rec.seqs("s")) == 5 })

	f.Dispatch(evs[5]) // head 6: attempts 1 and 2 fail, 3 hangs
	for range 2 {
		require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
		clock.Advance(10 * time.Second)
	}
	<-inFlight
	for _, e := range evs[6:10] { // the 4th queued sets it aside while 6 is in flight
		f.Dispatch(e)
	}
	require.Equal(t, 1, asides())
	close(answer)
	loop(t, f, evs[10:], func(n int) bool { return n == 0 && asides() == 0 && len(rec.seqs("s")) == len(evs) })
	inOrder(t, rec.of("s"), evs)
}

// idleWoken is the replica's dispatch loop once the last event came and a
// cursor round reported nothing: it waits without a bound for an event
// that never comes, which only Config.Wake (wakes) ends, then runs
// cursor rounds while they report something; until done holds.
func idleWoken(t *testing.T, f *Partition, wakes <-chan struct{}, done func() bool) {
	t.Helper()
	for {
		select {
		case <-wakes:
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the dispatch loop was never woken: the stream waits for an event that never comes")
		}
		for {
			n, err := f.CatchUp(t.Context())
			require.NoError(t, err)
			if done() {
				return
			}
			if n == 0 {
				break
			}
		}
	}
}

// A stream its lane sets aside as stuck after the partition's last event
// (the dispatch loop waiting for the next one, without a bound, since
// CatchUp had nothing to do) goes on: the lane wakes the loop, and once
// the head settles the stream's later events are read and sent in order.
// The rolling restart saw it when a stream rejoined and was set aside
// again once the writer had stopped: its head was processed, and nothing
// after it was ever sent.
func TestAStreamSetAsideAfterTheLastEventWakesTheDispatchLoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	evs := events(1, 8, 1) // order-0: seqs 1 … 8, versions 0 … 7
	g := newGate(1, 5)
	rec := newRecorder(g.answer)
	st := &store{}
	st.add(evs...)
	wakes := make(chan struct{}, 1)
	wake := func() {
		select {
		case wakes <- struct{}{}:
		default:
		}
	}
	f := New(Config{Archetype: base.New(clock, nil, ""), Wake: wake}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, st)
	t.Cleanup(f.Close)
	asides := func() int { return len(pos.Record().Asides) }

	// Set aside once while events still come, and rejoined.
	f.Dispatch(evs[0])
	f.Dispatch(evs[1])
	untilAside(t, clock, asides)
	f.Dispatch(evs[2])
	g.let(1)
	clock.Advance(10 * time.Second)
	loop(t, f, evs[3:4], func(n int) bool { return n == 0 && asides() == 0 && len(rec.seqs("s")) == 4 })

	// Its head 5 is retried past the last event, 8, and the lane alone
	// sets it aside.
	for _, e := range evs[4:] {
		f.Dispatch(e)
	}
	n, err := f.CatchUp(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "nothing for the cursors: the loop waits for the next event")
	select {
	case <-wakes:
	default:
	}
	untilAside(t, clock, asides) // the loop waits meanwhile
	g.let(5)
	clock.Advance(10 * time.Second)
	idleWoken(t, f, wakes, func() bool { return asides() == 0 && len(rec.seqs("s")) == len(evs) })
	inOrder(t, rec.of("s"), evs)
}

// Across a hand-over: the first owner sets the stream aside, its head
// settles and the record holding that is committed before it goes; the
// next owner's first cursor round reads the stream on and it rejoins;
// set aside again there after the partition's last event, it goes on
// the same way, every event once and in order over both owners.
func TestAStreamSetAsideAgainAfterAHandOverSendsItsLaterEventsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true})
	evs := events(1, 10, 1) // order-0: seqs 1 … 10, versions 0 … 9
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	g := newGate(1, 7)
	first := newRecorder(g.answer)
	f := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos, first, nil, st)
	asides := func(p *position.Partition) func() int { return func() int { return len(p.Record().Asides) } }
	for _, e := range evs[:3] {
		f.Dispatch(e)
	}
	untilAside(t, clock, asides(pos))
	g.let(1)
	clock.Advance(10 * time.Second)
	eventually(t, func() bool { return len(first.seqs("s")) == 1 }, "the head settles")
	require.NoError(t, pos.Flush(t.Context()))
	f.Close()
	stop()

	pos2, _ := b.claim(t, "replica-b", 2)
	require.Equal(t, []position.Aside{{Sub: "s", Stream: "events.order.order-0", From: 2, State: AsideReading}}, pos2.Record().Asides,
		"the next owner reads the stream from the head's successor")
	second := newRecorder(g.answer)
	wakes := make(chan struct{}, 1)
	f2 := New(Config{Archetype: base.New(clock, nil, ""), Wake: func() {
		select {
		case wakes <- struct{}{}:
		default:
		}
	}}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	loop(t, f2, evs[3:6], func(n int) bool { return n == 0 && len(pos2.Record().Asides) == 0 && len(second.seqs("s")) == 5 })

	// Its head 7 is retried past the last event, 10.
	for _, e := range evs[6:] {
		f2.Dispatch(e)
	}
	n, err := f2.CatchUp(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "nothing for the cursors: the loop waits for the next event")
	select {
	case <-wakes:
	default:
	}
	untilAside(t, clock, asides(pos2))
	g.let(7)
	clock.Advance(10 * time.Second)
	idleWoken(t, f2, wakes, func() bool { return len(pos2.Record().Asides) == 0 && len(second.seqs("s")) == len(evs)-1 })
	inOrder(t, append(first.of("s"), second.of("s")...), evs)
}
