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
)

// An unordered event whose attempt failed is recorded with its attempt
// count (a retries entry) and stops holding the floor back; its count
// follows each failure. A new owner fetches it by its sequence and goes
// on retrying it from that count, and sends nothing the floor covers.
func TestAnUnorderedEventInRetryLetsTheFloorPassAndANewOwnerRetriesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "u", Filters: []string{"events.order.>"}, MaxInFlight: 4})
	evs := events(1, 5, 5)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	clock := clockwork.NewFakeClock()
	first := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 2 {
			return Settlement{Act: Retry, Delay: time.Minute, Spent: d.Attempt} // each attempt spent one
		}
		return Settlement{Act: Delivered}
	})
	f := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return f.Floor() == 5 }, "the floor passes the event in retry")
	require.Equal(t, []position.Retry{{Sub: "u", Seq: 2, Attempts: 1}}, pos.Record().Retries)
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
	clock.Advance(time.Minute)
	eventually(t, func() bool { r := pos.Record().Retries; return len(r) == 1 && r[0].Attempts == 2 }, "the count follows each failure")
	require.NoError(t, clock.BlockUntilContext(t.Context(), 1))
	f.Close()
	stop() // its last commit holds the floor and the entry

	pos2, _ := b.claim(t, "replica-b", 2)
	var mu sync.Mutex
	attempts, spent := map[uint64]int{}, map[uint64]int{}
	second := newRecorder(func(d Delivery) Settlement {
		mu.Lock()
		attempts[d.Event.Seq] = d.Attempt
		spent[d.Event.Seq] = d.Spent
		mu.Unlock()
		return Settlement{Act: Delivered}
	})
	f2 := New(Config{Archetype: base.New(clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	require.Equal(t, uint64(5), f2.Floor())
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(second.seqs("u")) == 1
	}, "the new owner fetches the event and retries it")
	mu.Lock()
	require.Equal(t, map[uint64]int{2: 3}, attempts, "from its count on, and nothing the floor covers")
	require.Equal(t, map[uint64]int{2: 2}, spent, "the count handed to the Sender")
	mu.Unlock()
	eventually(t, func() bool { return len(pos2.Record().Retries) == 0 }, "its entry goes once it settled")
	require.Equal(t, uint64(5), f2.Floor())
}

// A fan-out closed (a graceful release) while an unordered event is not
// sent yet, with a later one settled, leaves the unsent one a retries
// entry: the floor passes it, and the next owner sends it alone, not the
// later one again.
func TestAnUnorderedEventUnsentAtCloseBelowASettledOneIsAllTheNextOwnerSends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idx := members(t, member.Member{Name: "u", Filters: []string{"events.order.>"}, MaxInFlight: 4})
	evs := events(1, 3, 3)
	st := &store{}
	st.add(evs...)
	pos, stop := b.claim(t, "replica-a", 1)
	var f *Partition
	first := newRecorder(func(d Delivery) Settlement {
		if d.Event.Seq == 2 {
			<-f.ctx.Done() // waits (for a slot, a throttle) until the release: nothing sent
			return Settlement{Act: Retry}
		}
		return Settlement{Act: Delivered}
	})
	f = New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos, first, nil, st)
	for _, e := range evs {
		f.Dispatch(e)
	}
	eventually(t, func() bool { return len(first.seqs("u")) == 2 }, "the events around it settle")
	require.Equal(t, uint64(1), f.Floor(), "the unsent one holds the floor")
	f.Close()
	stop() // its last commit
	require.Equal(t, uint64(3), pos.Record().Floor, "the floor passes the unsent event")
	require.Equal(t, []position.Retry{{Sub: "u", Seq: 2}}, pos.Record().Retries)

	pos2, _ := b.claim(t, "replica-b", 2)
	second := newRecorder(nil)
	f2 := New(Config{Archetype: base.New(b.clock, nil, "")}, idx, pos2, second, nil, st)
	t.Cleanup(f2.Close)
	for _, e := range evs {
		if e.Seq > f2.Floor() {
			f2.Dispatch(e)
		}
	}
	eventually(t, func() bool {
		n, err := f2.CatchUp(t.Context())
		require.NoError(t, err)
		return n == 0 && len(second.seqs("u")) == 1
	}, "the new owner fetches the unsent event and sends it")
	require.Equal(t, []uint64{2}, second.seqs("u"), "it alone: the one settled above it is not sent again")
	eventually(t, func() bool { return len(pos2.Record().Retries) == 0 }, "its entry goes once it settled")
}
