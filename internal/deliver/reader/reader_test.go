package reader_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

const partitions = 16

// bus is an embedded JetStream with the events stream, and what was
// published to it: the partition of each sequence.
type bus struct {
	js        jetstream.JetStream
	partition map[uint64]int
}

func setup(t testing.TB, allowDirect bool) *bus {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: allowDirect})
	require.NoError(t, err)
	return &bus{js: js, partition: map[uint64]int{}}
}

// publish stores n events round robin over 64 streams, each with a
// Nats-Msg-Id, and one message on a subject that is no event's.
func (b *bus) publish(t *testing.T, n int) {
	t.Helper()
	for range n {
		k := len(b.partition)
		stream := fmt.Sprintf("c-%d", k%64)
		ack, err := b.js.Publish(t.Context(), wire.Subject(wire.DefaultEventsPrefix, stream, "Happened"),
			[]byte(fmt.Sprintf(`{"k":%d}`, k)), jetstream.WithMsgID(fmt.Sprintf("id-%d", k)))
		require.NoError(t, err)
		b.partition[ack.Sequence] = wire.StreamPartition(stream, partitions)
	}
	ack, err := b.js.Publish(t.Context(), wire.DefaultEventsPrefix+".stray", []byte(`{}`))
	require.NoError(t, err)
	b.partition[ack.Sequence] = -1
}

// seqs returns the sequences of partition p in (after, upTo], in order.
func (b *bus) seqs(p int, after, upTo uint64) []uint64 {
	var out []uint64
	for seq := after + 1; seq <= upTo; seq++ {
		if q, ok := b.partition[seq]; ok && q == p {
			out = append(out, seq)
		}
	}
	return out
}

func (b *bus) last() uint64 { return uint64(len(b.partition)) }

func open(t *testing.T, b *bus, cfg reader.Config, from uint64) *reader.Reader {
	t.Helper()
	r, err := reader.Open(t.Context(), b.js, cfg, from)
	require.NoError(t, err)
	t.Cleanup(r.Stop)
	return r
}

// next reads n events, failing after 10 s.
func next(t *testing.T, r *reader.Reader, n int) []reader.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var out []reader.Event
	for range n {
		ev, err := r.Next(ctx)
		require.NoError(t, err, "after %d of %d events", len(out), n)
		out = append(out, ev)
	}
	return out
}

// byPartition groups events' sequences by partition, in the order Next
// returned them.
func byPartition(evs []reader.Event) map[int][]uint64 {
	out := map[int][]uint64{}
	for _, ev := range evs {
		out[ev.Partition] = append(out[ev.Partition], ev.Seq)
	}
	return out
}

func TestNextHandsOnTheTakenPartitionsOnlyInStreamOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 200)
	r := open(t, b, reader.Config{}, 1)
	require.NoError(t, r.Take(0, 0))
	require.NoError(t, r.Take(5, 0))

	want := map[int][]uint64{0: b.seqs(0, 0, b.last()), 5: b.seqs(5, 0, b.last())}
	evs := next(t, r, len(want[0])+len(want[5]))
	require.Equal(t, want, byPartition(evs))
	for i, ev := range evs {
		if i > 0 {
			require.Less(t, evs[i-1].Seq, ev.Seq, "stream order")
		}
		stream, _, err := wire.ParseSubject(wire.DefaultEventsPrefix, ev.Subject)
		require.NoError(t, err)
		require.Equal(t, wire.StreamPartition(stream, partitions), ev.Partition)
		require.NotEmpty(t, ev.Header.Get(jetstream.MsgIDHeader), "the message's own headers")
		require.NotEmpty(t, ev.Data)
		require.False(t, ev.Time.IsZero())
	}
	require.Equal(t, evs[len(evs)-1].Seq, r.Head(), "the head is the last sequence read")
}

func TestAPartitionTakenAtTheHeadIsHandedOnFromTheNextEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 100)
	r := open(t, b, reader.Config{}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()

	r.Release(0)
	require.NoError(t, r.Take(1, h))
	b.publish(t, 100)
	evs := next(t, r, len(b.seqs(1, h, b.last())))
	require.Equal(t, map[int][]uint64{1: b.seqs(1, h, b.last())}, byPartition(evs),
		"partition 0 released; partition 1 from the head on, nothing of it read back")
	require.ErrorContains(t, r.Take(1, 0), "already taken")
	require.ErrorContains(t, r.Take(partitions, 0), "partition 16")
}

// A partition taken below the head is caught up from its floor to the
// head by direct gets, then handed on live: every event of it once, in
// order; a partition taken during the catch-up with a lower floor reads
// back without repeating the others' events.
func TestAPartitionTakenBelowTheHeadCatchesUpThenGoesLive(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 300)
	r := open(t, b, reader.Config{Batch: 16}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()
	require.Greater(t, h, uint64(200))

	require.NoError(t, r.Take(1, 50))
	require.NoError(t, r.Take(2, 120))
	b.publish(t, 100)

	first := next(t, r, 3)
	require.NoError(t, r.Take(3, 10)) // during the catch-up, a lower floor
	want := map[int][]uint64{
		0: b.seqs(0, h, b.last()),
		1: b.seqs(1, 50, b.last()),
		2: b.seqs(2, 120, b.last()),
		3: b.seqs(3, 10, b.last()),
	}
	n := -len(first)
	for _, s := range want {
		n += len(s)
	}
	evs := append(first, next(t, r, n)...)
	require.Equal(t, want, byPartition(evs), "every event of each partition once, in order")
	require.GreaterOrEqual(t, r.Unpartitioned(), uint64(1), "the stray subject was passed over")
}

func TestACatchUpWithoutDirectGetsSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.publish(t, 50)
	r := open(t, b, reader.Config{}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	require.NoError(t, r.Take(1, 0))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := r.Next(ctx)
	require.ErrorIs(t, err, reader.ErrNoDirectGet)

	r.Release(1) // the caller's way out: the partition goes, the reader goes on
	b.publish(t, 20)
	evs := next(t, r, len(b.seqs(0, r.Head(), b.last())))
	require.Len(t, byPartition(evs), 1)
}

func TestOpenRefusesABadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	for _, c := range []struct {
		cfg  reader.Config
		from uint64
		want string
	}{
		{reader.Config{Partitions: 2000}, 1, "Partitions 2000"},
		{reader.Config{Partitions: -1}, 1, "Partitions -1"},
		{reader.Config{Prefix: "events.*"}, 1, "Prefix"},
		{reader.Config{Batch: -1}, 1, "Batch -1"},
		{reader.Config{}, 0, "start sequence 0"},
	} {
		_, err := reader.Open(t.Context(), b.js, c.cfg, c.from)
		require.True(t, errors.Is(err, reader.ErrInvalidConfig), "%+v: %v", c.cfg, err)
		require.ErrorContains(t, err, c.want)
	}
}

// While a catch-up runs, the live read goes on between its batches: a
// live partition's new events are handed on before the catch-up ends,
// and the caught-up partition's events read live meanwhile come from the
// catch-up, in their order: every event of each partition once.
func TestACatchUpInterleavesWithTheLiveRead(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 400)
	r := open(t, b, reader.Config{Batch: 4}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()
	b.publish(t, 100) // at hand for the live read: partition 0's and 1's

	require.NoError(t, r.Take(1, 0)) // a catch-up of (0, h] in batches of 4
	want := map[int][]uint64{0: b.seqs(0, h, b.last()), 1: b.seqs(1, 0, b.last())}
	evs := next(t, r, len(want[0])+len(want[1]))
	require.Equal(t, want, byPartition(evs), "every event of each partition once, in order")
	firstLive, lastCaughtUp := -1, -1
	for i, ev := range evs {
		if ev.Partition == 0 && firstLive < 0 {
			firstLive = i
		}
		if ev.Partition == 1 && ev.Seq <= h {
			lastCaughtUp = i
		}
	}
	require.Less(t, firstLive, lastCaughtUp, "partition 0 went on while partition 1 caught up")
	require.Greater(t, r.Head(), h, "the head moved during the catch-up")
}

// A partition taken below the catch-up's scan, while a batch read for the
// others is still being handed on, gets every event of it once, in
// order: the batch at hand is read again from the lower floor rather
// than handed on first (which would carry the new partition past the
// events between its floor and the batch, never to be handed on).
func TestAPartitionTakenBelowTheScanMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 300)
	r := open(t, b, reader.Config{Batch: 128}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()

	require.NoError(t, r.Take(1, 150))
	first := next(t, r, 1) // the catch-up's first batch, (150, 278], is at hand
	require.NoError(t, r.Take(3, 10))
	want := map[int][]uint64{
		1: b.seqs(1, 150, h),
		3: b.seqs(3, 10, h),
	}
	require.NotEmpty(t, b.seqs(3, 150, h), "the batch at hand holds events of the partition taken")
	evs := append(first, next(t, r, len(want[1])+len(want[3])-1)...)
	require.Equal(t, want, byPartition(evs), "every event of each partition once, in order")
}

// A burst of takes at different floors below the head, as a replica that
// wakes from a freeze makes them, one of them released and taken again in
// between as a hand-over does, each arriving mid-catch-up with a batch
// at hand: a take whose floor lies inside that batch, above events of the
// other partitions not handed on yet, rewinds the scan no further than
// those events. Every event of each taken partition above its floor is
// handed on once, in order.
func TestABurstOfTakesBelowTheHeadMidCatchUpLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 600)
	r := open(t, b, reader.Config{Batch: 128}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()

	// Partition 1's catch-up reads (100, 228]; one event of it is handed
	// on, the rest of the batch at hand.
	require.NoError(t, r.Take(1, 100))
	evs := next(t, r, 1)
	require.NotEmpty(t, b.seqs(1, evs[0].Seq, 200), "partition 1 has events at hand below the next floor")
	// Partition 2 inside the batch at hand, above partition 1's events in it.
	require.NoError(t, r.Take(2, 200))
	evs = append(evs, next(t, r, 1)...)
	// Partition 3 above the scan, then 4 inside the rewound batch.
	require.NoError(t, r.Take(3, 400))
	require.NoError(t, r.Take(4, 150))
	evs = append(evs, next(t, r, 2)...)
	// A hand-over: 2 released, with events of it at hand, and taken
	// again at a higher floor; 5 taken inside the batch meanwhile.
	handed := byPartition(evs)[2]
	r.Release(2)
	require.NoError(t, r.Take(5, 170))
	require.NoError(t, r.Take(2, 260))

	want := map[int][]uint64{
		1: b.seqs(1, 100, h),
		2: append(b.seqs(2, 200, h)[:len(handed)], b.seqs(2, 260, h)...),
		3: b.seqs(3, 400, h),
		4: b.seqs(4, 150, h),
		5: b.seqs(5, 170, h),
	}
	n := 0
	for _, seqs := range want {
		n += len(seqs)
	}
	evs = append(evs, next(t, r, n-len(evs))...)
	require.Equal(t, want, byPartition(evs), "every event of each partition once, in order")
}

// Every event Next hands on, read live or caught up by direct gets,
// carries an Envelope of its own, which its copies share: the body the
// first webhook builds is the one the others send, built once however
// many ask at once.
func TestAnEventsEnvelopeIsBuiltOnceForEveryCopy(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 40)
	r := open(t, b, reader.Config{Partitions: partitions}, 1)
	require.NoError(t, r.Take(1, 0))
	evs := next(t, r, len(b.seqs(1, 0, b.last()))) // live; the head is past partition 2's first events now
	require.NoError(t, r.Take(2, 0))               // below the head: caught up by direct gets
	evs = append(evs, next(t, r, len(b.seqs(2, 0, b.last())))...)
	seen := map[*reader.Envelope]bool{}
	for _, ev := range evs {
		require.NotNil(t, ev.Envelope, "event %d", ev.Seq)
		require.False(t, seen[ev.Envelope], "event %d shares another event's envelope", ev.Seq)
		seen[ev.Envelope] = true
	}

	ev := evs[0]
	var builds atomic.Int32
	var wg sync.WaitGroup
	bodies := make([][]byte, 8)
	for i := range bodies {
		cp := ev // as the fan-out hands a copy to each subscription
		wg.Go(func() {
			bodies[i], _ = cp.Envelope.Body(func() ([]byte, error) {
				builds.Add(1)
				return []byte(fmt.Sprintf("body of %d", cp.Seq)), nil
			})
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), builds.Load(), "built once")
	for _, body := range bodies {
		require.Equal(t, fmt.Sprintf("body of %d", ev.Seq), string(body))
	}

	var none *reader.Envelope // an Event made by hand: built each time
	for range 2 {
		_, _ = none.Body(func() ([]byte, error) { builds.Add(1); return nil, nil })
	}
	require.Equal(t, int32(3), builds.Load())
}

// TestNextWaitsOnTheContextItIsGiven: the live wait's option is kept
// for a context across calls; a wait ended by its context returns that
// context's error, and Next with another context waits on the new one
// and reads on.
func TestNextWaitsOnTheContextItIsGiven(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 20)
	r := open(t, b, reader.Config{}, 1)
	for p := range partitions {
		require.NoError(t, r.Take(p, 0))
	}
	next(t, r, 20)

	ended, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := r.Next(ended)
	require.ErrorIs(t, err, context.Canceled)
	short, stop := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer stop()
	_, err = r.Next(short)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the new context's end, not the old one's")

	b.publish(t, 5)
	require.Len(t, next(t, r, 5), 5)
}
