package fanout

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// gated is a Position whose Wait first waits for the test's gate, and
// remembers which settlements a Wait returned for.
type gated struct {
	*position.Partition
	waiting chan uint64
	gate    chan struct{}
	mu      sync.Mutex
	done    map[uint64]bool
}

func (g *gated) Wait(ctx context.Context, sub, stream string, seq uint64) error {
	g.waiting <- seq
	<-g.gate
	err := g.Partition.Wait(ctx, sub, stream, seq)
	if err == nil {
		g.mu.Lock()
		g.done[seq] = true
		g.mu.Unlock()
	}
	return err
}

func (g *gated) committed(seq uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[seq]
}

func members(t *testing.T, ms ...member.Member) *member.Index {
	t.Helper()
	idx := member.NewIndex()
	for _, m := range ms {
		require.NoError(t, idx.Put(m))
	}
	return idx
}

// A stream's version v+1 goes out only once the commit covering v's
// settlement succeeded (write before next, R2), naming v as its
// predecessor; the record then covers both.
func TestAStreamsNextVersionWaitsForTheCommitOfThePrevious(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	g := &gated{Partition: pos, waiting: make(chan uint64, 1), gate: make(chan struct{}), done: map[uint64]bool{}}
	var early atomic.Bool
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 2 && !g.committed(1) {
			early.Store(true)
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), g, rec, nil, nil)
	t.Cleanup(f.Close)

	f.Dispatch(event(1, "order-1", 0))
	f.Dispatch(event(2, "order-1", 1))
	require.Equal(t, uint64(1), <-g.waiting, "the lane waits for the commit of version 0")
	require.Equal(t, []uint64{1}, rec.seqs("s"), "version 1 is not sent meanwhile")
	close(g.gate)
	eventually(t, func() bool { return len(rec.seqs("s")) == 2 }, "version 1 goes once the commit succeeded")
	require.False(t, early.Load(), "version 1 was sent before the commit covering version 0")
	require.Equal(t, []sent{{1, "events.order.order-1", NoPrevious}, {2, "events.order.order-1", 0}}, rec.of("s"))
	eventually(t, func() bool { return f.Floor() == 2 }, "the floor rises past both")
}

// A new owner sends nothing the record says was settled: the fast
// subscription's events above the floor (its own entries), while the
// slow one, which held the floor back, gets every event of it.
func TestEventsTheRecordCoversAreNotSentAgainAfterANewClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t,
		member.Member{Name: "fast", Filters: []string{"events.order.>"}, Ordered: true},
		member.Member{Name: "slow", Filters: []string{"events.order.>"}, Ordered: true, MaxInHand: 100})
	evs := events(1, 12, 3)
	pos, stop := b.claim(t, "replica-a", 1)
	var f *Partition
	first := newRecorder(func(d Delivery) Settlement {
		if d.Subscription == "slow" {
			<-f.ctx.Done() // never answers: the owner goes first
			return Settlement{Act: Retry}
		}
		return Settlement{Act: Delivered}
	})
	f = New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, nil)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(first.seqs("fast")) == len(evs) }, "the fast one settles all")
	for stream, last := range map[string]uint64{"order-0": 10, "order-1": 11, "order-2": 12} {
		require.NoError(t, pos.Wait(t.Context(), "fast", "events.order."+stream, last))
	}
	require.Equal(t, uint64(0), f.Floor(), "the slow one holds the floor")
	f.Close()
	stop()
	require.Len(t, first.seqs("slow"), 0, "nothing of the slow one settled before the owner went")

	pos2, _ := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, nil)
	t.Cleanup(f2.Close)
	for _, e := range evs {
		f2.Dispatch(e)
	}
	eventually(t, func() bool { return len(second.seqs("slow")) == len(evs) }, "the slow one gets every event")
	inOrder(t, second.of("slow"), evs)
	require.Empty(t, second.of("fast"), "nothing the record covers is sent again")
	eventually(t, func() bool { return f2.Floor() == 12 }, "the floor rises past all")
}

// An unordered subscription sends one hot stream's events in parallel up
// to its MaxInFlight, never more, and its settlements wait for no
// commit: all of them settle while the record is never written.
func TestAnUnorderedHotStreamsSendsOverlapUpToTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	before, err := b.kv.Get(t.Context(), position.Key(0))
	require.NoError(t, err)
	var running, most atomic.Int32
	proceed := make(chan struct{})
	rec := newRecorder(func(Delivery) Settlement {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-proceed
		running.Add(-1)
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "u", Filters: []string{"events.>"}, MaxInFlight: 4}), pos, rec, nil, nil)
	t.Cleanup(f.Close)
	hot := events(1, 20, 1)
	for _, e := range hot {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return running.Load() == 4 }, "four sends of the one stream run at once")
	require.Empty(t, rec.seqs("u"), "none settled yet")
	close(proceed)
	eventually(t, func() bool { return len(rec.seqs("u")) == 20 }, "every event settles")
	require.Equal(t, int32(4), most.Load(), "never more than MaxInFlight at once")
	eventually(t, func() bool { return f.Floor() == 20 }, "the floor rises past all")
	after, err := b.kv.Get(t.Context(), position.Key(0))
	require.NoError(t, err)
	require.Equal(t, before.Revision(), after.Revision(), "no commit was waited for (the linger never ran out)")
}

// A slow subscription beside a hundred fast ones on one partition: the
// fast ones get every event while it holds MaxInHand; it gets a cursor,
// stops holding the floor back and, once it recovers, catches up through
// its own reads, receives every event once, in order, and rejoins.
func TestASlowSubscriptionGetsACursorWhileTheFastOnesGoOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	idx := members(t, member.Member{Name: "slow", Filters: []string{"events.order.>"}, Ordered: true, MaxInHand: 3})
	for i := range 100 {
		require.NoError(t, idx.Put(member.Member{Name: fmt.Sprintf("fast%d", i), Filters: []string{"events.order.>"}, Ordered: i%2 == 0, MaxInFlight: 4}))
	}
	recovered := make(chan struct{})
	var f *Partition
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Subscription == "slow" {
			select { // an endpoint that does not answer until it recovers
			case <-recovered:
			case <-f.ctx.Done():
				return Settlement{Act: Retry}
			}
		}
		return Settlement{Act: Delivered}
	})
	st := &store{}
	f = New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, rec, nil, st)
	t.Cleanup(f.Close)
	evs := events(1, 40, 4)
	st.add(evs...)
	for _, e := range evs {
		f.Dispatch(e)
	}
	for i := range 100 {
		name := fmt.Sprintf("fast%d", i)
		eventually(t, func() bool { return len(rec.seqs(name)) == 40 }, name+" gets every event")
	}
	require.Equal(t, map[string]string{"slow": StateBehind}, f.Behind())
	eventually(t, func() bool { return f.Floor() == 40 }, "the slow one no longer holds the floor back")
	require.NotContains(t, pos.Record().Members, "slow")
	more := events(41, 8, 4)
	for i := range more {
		more[i] = event(more[i].Seq, fmt.Sprintf("order-%d", i%4), 10+i/4)
	}
	st.add(more...)
	for _, e := range more {
		f.Dispatch(e)
	}

	close(recovered)
	// The replica's loop: a cursor round, then a live event (the first
	// twenty rounds: the test's load must not outrun the machine, under
	// -race), until the slow one is live again.
	all := append(evs, more...)
	next := uint64(49)
	eventually(t, func() bool {
		n, err := f.CatchUp(t.Context())
		if err != nil {
			t.Errorf("CatchUp: %v", err)
			return true
		}
		if next < 69 {
			e := event(next, fmt.Sprintf("order-%d", next%4), int(next))
			st.add(e)
			f.Dispatch(e)
			all = append(all, e)
			next++
		}
		return n == 0
	}, "the slow one rejoins")
	eventually(t, func() bool { return len(rec.seqs("slow")) == len(all) }, "the slow one receives every event")
	inOrder(t, rec.of("slow"), all)
	require.Empty(t, f.Behind())
	require.Contains(t, pos.Record().Members, "slow", "it rejoined")
	f.Dispatch(event(next, "order-0", int(next)))
	eventually(t, func() bool { return len(rec.seqs("slow")) == len(all)+1 }, "live again")
	eventually(t, func() bool { return len(rec.seqs("fast0")) == len(all)+1 }, "the fast ones got every event too")
}

// Pause gives a subscription a cursor: nothing is sent to it and the
// floor passes its events; resume catches it up, every event once, and
// it rejoins.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	rec := newRecorder(nil)
	st := &store{}
	idx := members(t, member.Member{Name: "p", Filters: []string{"events.order.>"}, Ordered: true})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, rec, nil, st)
	t.Cleanup(f.Close)
	require.NoError(t, f.SetState("p", StatePaused))
	require.Error(t, f.SetState("p", "asleep"), "an unknown state is refused")
	require.Error(t, f.SetState("nobody", StatePaused), "a subscription not in the members is refused")
	evs := events(1, 10, 2)
	st.add(evs...)
	for _, e := range evs {
		f.Dispatch(e)
	}
	n, err := f.CatchUp(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "a paused cursor reads nothing")
	require.Empty(t, rec.seqs("p"))
	require.Equal(t, uint64(10), f.Floor(), "the floor passes a paused subscription's events")
	require.Equal(t, StatePaused, pos.Cursors()["p"].State)

	require.NoError(t, f.SetState("p", ""))
	catchUp(t, f)
	eventually(t, func() bool { return len(rec.seqs("p")) == 10 }, "resumed, it receives every event")
	inOrder(t, rec.of("p"), evs)
	f.Dispatch(event(11, "order-0", 5))
	eventually(t, func() bool { return len(rec.seqs("p")) == 11 }, "and is live again")
}

// A dead-lettered head whose settlement parks its stream: the stream's
// later events are not sent to the subscription (an aside entry covers
// them), the other streams go on, and the floor passes them.
func TestAParkedStreamsLaterEventsAreNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 1 {
			return Settlement{Act: Park}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, nil)
	t.Cleanup(f.Close)
	evs := events(1, 6, 2) // order-0: 1, 3, 5; order-1: 2, 4, 6
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 6 }, "the floor passes the parked stream")
	require.ElementsMatch(t, []uint64{1, 2, 4, 6}, rec.seqs("s"))
	require.Equal(t, []position.Aside{{Sub: "s", Stream: "events.order.order-0", From: 1, State: "parked"}}, pos.Record().Asides)
}

// The version chain: a stream's first event since the claim names the
// record's entry when there is one, else the Chain's answer; a
// dead-lettered version is skipped by the next one's predecessor.
func TestTheChainNamesTheEntryTheLookupOrTheLastDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	pos.Settled("s", "events.order.order-0", position.Entry{Seq: 4, Version: 6})
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 9 {
			return Settlement{Act: DeadLetter}
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, lookup{}, nil)
	t.Cleanup(f.Close)
	for _, e := range []reader.Event{event(5, "order-0", 7), event(6, "order-1", 3), event(9, "order-1", 4), event(10, "order-1", 5)} {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(rec.seqs("s")) == 4 }, "all four settle")
	got := map[uint64]int64{}
	for _, s := range rec.of("s") {
		got[s.seq] = s.previous
	}
	require.Equal(t, map[uint64]int64{5: 6, 6: 102, 9: 3, 10: 3}, got)
}

// lookup is a Chain that always answers version 102.
type lookup struct{}

func (lookup) Previous(context.Context, string, string, uint64) (int64, error) { return 102, nil }

// A cursor a former owner made is the next owner's: the subscription
// starts behind, in the state it was left in, and catches up from its
// cursor once resumed.
func TestACursorMadeByAFormerOwnerIsTheNextOwners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "p", Filters: []string{"events.order.>"}, Ordered: true},
		member.Member{Name: "q", Filters: []string{"events.order.>"}})
	evs := events(1, 6, 2)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	first := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	require.NoError(t, f.SetState("p", StatePaused))
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(first.seqs("q")) == 6 }, "q gets every event")
	eventually(t, func() bool { return f.Floor() == 6 }, "the floor passes p's events")
	f.Close()
	stop() // its last commit holds the floor and p's cursor

	pos2, _ := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.Equal(t, map[string]string{"p": StatePaused}, f2.Behind())
	require.Equal(t, uint64(6), f2.Floor())
	require.NoError(t, f2.SetState("p", ""))
	catchUp(t, f2)
	eventually(t, func() bool { return len(second.seqs("p")) == 6 }, "p gets every event once resumed")
	inOrder(t, second.of("p"), evs)
	require.Empty(t, second.of("q"), "q settled them all under the former owner")
}

// A former owner stops once a new owner claimed the record: the commit
// its lane waits for fails with position.ErrLost, the stream's next
// version is not sent, and Err says why.
func TestAFormerOwnerSendsNothingMoreOnceTheRecordIsClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	claimed := make(chan struct{})
	rec := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 1 {
			<-claimed
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: true}), pos, rec, nil, nil)
	t.Cleanup(f.Close)
	f.Dispatch(event(1, "order-1", 0))
	f.Dispatch(event(2, "order-1", 1))
	_, err := position.Claim(t.Context(), b.js, b.kv, position.Config{Owner: "replica-b", Epoch: 2, Archetype: base.New(b.clock, nil, "")})
	require.NoError(t, err)
	close(claimed)
	eventually(t, func() bool { return f.Err() != nil }, "the fan-out stops")
	require.ErrorIs(t, f.Err(), position.ErrLost)
	require.Equal(t, []uint64{1}, rec.seqs("s"), "version 1 is not sent")
	f.Dispatch(event(3, "order-2", 0))
	require.Equal(t, []uint64{1}, rec.seqs("s"), "nor anything dispatched after")
}
