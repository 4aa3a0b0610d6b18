package fanout

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/cursor"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// backlog publishes n events to the events stream of js, round robin
// over streams streams of category order that all hash to one partition
// (of 16), and returns that partition and the events as the reader
// hands them.
func backlog(t *testing.T, js jetstream.JetStream, n, streams int) (int, []reader.Event) {
	t.Helper()
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	part := wire.StreamPartition("order-0", 16)
	var names []string
	for i := 0; len(names) < streams; i++ {
		if name := fmt.Sprintf("order-%d", i); wire.StreamPartition(name, 16) == part {
			names = append(names, name)
		}
	}
	var evs []reader.Event
	var acks []jetstream.PubAckFuture
	for i := range n {
		h := nats.Header{wire.HeaderStreamVersion: {strconv.Itoa(i / streams)}}
		subject := wire.Subject(wire.DefaultEventsPrefix, names[i%streams], "Placed")
		a, err := js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: h, Data: []byte("{}")})
		require.NoError(t, err)
		acks = append(acks, a)
		evs = append(evs, reader.Event{Subject: subject, Partition: part, Header: h})
	}
	for i, a := range acks {
		select {
		case ack := <-a.Ok():
			evs[i].Seq = ack.Sequence
		case err := <-a.Err():
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatalf("publish %d: no ack in a minute", i)
		}
	}
	return part, evs
}

// missing returns the sequences of want that got does not hold, as runs
// ("12-40"), for a failure that says where events went.
func missing(got []sent, want []reader.Event) []string {
	have := map[uint64]bool{}
	for _, s := range got {
		have[s.seq] = true
	}
	var runs []string
	var from, to uint64
	flush := func() {
		if from > 0 {
			runs = append(runs, fmt.Sprintf("%d-%d", from, to))
		}
		from = 0
	}
	for _, e := range want {
		switch {
		case have[e.Seq]:
			flush()
		case from == 0:
			from, to = e.Seq, e.Seq
		default:
			to = e.Seq
		}
	}
	flush()
	return runs
}

// A subscription with a small MaxInHand behind a backlog of thousands of
// events, whose endpoint cannot keep up with the reader: the replica's
// loop dispatches bursts of live events between cursor rounds, so the
// subscription gets a cursor, catches up, rejoins with events of its
// reads still waiting to be sent, and is given a cursor again, many
// times over (the throughput benchmark's 50,000 events behind one
// subscription). It receives every event, on the events stream itself
// (cursor.Reader) and a real position record, whether it is unordered or
// ordered, with one stream or several.
func TestASubscriptionBehindABacklogReceivesEveryEvent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("publishes and reads thousands of events")
	}
	for _, tc := range []struct {
		name    string
		ordered bool
		streams int
	}{
		{"unordered one stream", false, 1},
		{"unordered several streams", false, 6},
		{"ordered one stream", true, 1},
		{"ordered several streams", true, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			part, evs := backlog(t, b.js, 3000, tc.streams)
			pos, _ := b.claim(t, "replica-a", 1)
			rec := newRecorder(nil)
			m := member.Member{Name: "s", Filters: []string{"events.order.>"}, Ordered: tc.ordered, MaxInHand: 20}
			f := New(Config{Partition: part, Archetype: base.New(b.clock, nil, "")}, members(t, m), pos, rec, nil, cursor.NewReader(b.js, reader.Config{}))
			t.Cleanup(f.Close)

			// The replica's loop: bursts of live events (the reader is
			// faster than the endpoint) between cursor rounds, of sizes
			// a fixed seed draws.
			rnd := rand.New(rand.NewPCG(20, uint64(tc.streams)))
			round := func() int {
				n, err := f.CatchUp(t.Context())
				require.NoError(t, err)
				return n
			}
			for next := 0; next < len(evs); {
				for range rnd.IntN(40) + 1 {
					if next < len(evs) {
						f.Dispatch(evs[next])
						next++
					}
				}
				if rnd.IntN(4) > 0 {
					round()
					continue
				}
				// A quiet spell: the subscription reads up to the head
				// and is live again, its reads' events still in hand.
				eventually(t, func() bool { round(); return live(f, "s") }, "it reads up to the head")
			}
			last := evs[len(evs)-1].Seq
			require.Eventually(t, func() bool { return round() == 0 && f.Floor() == last },
				time.Minute, 2*time.Millisecond, "every cursor rejoins and the floor reaches the last event")
			// Settled by the floor and no cursor left: nothing more is
			// read, so what was not sent by now never will be.
			eventually(t, func() bool { return len(missing(rec.of("s"), evs)) == 0 || len(f.Behind()) == 0 && idle(f, "s") },
				"every send ends")
			require.Empty(t, missing(rec.of("s"), evs), "events never sent, yet settled by the floor")
			if tc.ordered {
				inOrder(t, rec.of("s"), evs)
			}
		})
	}
}

// live reports whether sub is live on f (its cursor may stay until what
// its reads brought settled).
func live(f *Partition, sub string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.subs[sub]
	return st != nil && st.state == ""
}

// idle reports whether sub has nothing in hand on f.
func idle(f *Partition, sub string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.subs[sub]
	return st == nil || len(st.inHand) == 0
}
