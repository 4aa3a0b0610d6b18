package position

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// coveredNow is what Wait looks at before it waits: whether what is
// stored covers sub's settlement of seq on stream.
func coveredNow(p *Partition, sub, stream string, seq uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.covered(&p.stored, sub, stream, seq)
}

// A subscription with a cursor whose floor passed a stream set aside for
// it (the cursor's floor, like the record's, passes an aside's events
// unsettled): its settlement of the aside's head is covered only once a
// commit holding it succeeded, not by the cursor's floor. Else its lane
// sent the stream's next version before the settlement was written (R2),
// and a new owner, reading the stream from the aside, sent the versions
// in between again after it.
func TestACursorsFloorDoesNotCoverAStreamSetAside(t *testing.T) {
	t.Parallel()
	js, kv := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock() // never advanced: only waiters make commits go
	p := claim(t, js, kv, "replica-a", 1, clock)
	run(t, p)

	p.Edit(func(r *Record) {
		r.Floor, r.Members["s"] = 100, 100
		r.Asides = []Aside{{Sub: "s", Stream: "order-1", From: 40, State: "stuck"}}
	})
	require.True(t, p.Detach("s", "behind"))
	require.NoError(t, p.Flush(ctx))
	require.Equal(t, uint64(100), p.Cursors()["s"].Floor, "the cursor's floor passed the aside")
	require.False(t, coveredNow(p, "s", "order-1", 40), "the aside's head is not settled")
	require.True(t, coveredNow(p, "s", "order-2", 40), "another stream: the cursor's floor")

	// The head settles; the aside moves past it. Nothing is committed yet.
	p.Settled("s", "order-1", Entry{Seq: 40, Version: 36})
	p.Edit(func(r *Record) { r.Asides[0].From, r.Asides[0].State = 41, "behind" })
	require.False(t, coveredNow(p, "s", "order-1", 40), "not committed yet: the next version waits")

	require.NoError(t, p.Wait(ctx, "s", "order-1", 40))
	rec, _ := stored(t, kv)
	require.Equal(t, uint64(41), rec.Asides[0].From, "released once the record holds the aside's move past it")
	require.True(t, coveredNow(p, "s", "order-1", 40))
	require.False(t, coveredNow(p, "s", "order-1", 41), "the aside's next event is not settled")
}

// failRecordKV is a bucket whose next Update of the record fails (a
// timeout) without writing it; cursor keys are written.
type failRecordKV struct {
	jetstream.KeyValue
	fail atomic.Bool
}

func (kv *failRecordKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if key == Key(0) && kv.fail.CompareAndSwap(true, false) {
		return 0, errors.New("nats: timeout")
	}
	return kv.KeyValue.Update(ctx, key, value, last)
}

// A commit whose cursor keys were written but whose record was not
// covers nothing: the record's compare-and-set fences the cursor keys,
// and a new owner reading the record of before may drop them (a
// detach's keys) or read them with the asides of before. A waiter is
// released by the commit that goes again.
func TestACursorKeyWrittenWithoutItsRecordCoversNothing(t *testing.T) {
	t.Parallel()
	js, bucket := setup(t)
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	kv := &failRecordKV{KeyValue: bucket}
	p := claim(t, js, kv, "replica-a", 1, clock)
	run(t, p)
	p.Edit(func(r *Record) { r.Floor, r.Members["s"] = 10, 10 })
	require.True(t, p.Detach("s", "behind"))
	require.NoError(t, p.Flush(ctx))

	kv.fail.Store(true)
	p.Settled("s", "order-1", Entry{Seq: 12, Version: 5})
	w := waitFor(p, "s", "order-1", 12)
	require.Eventually(t, func() bool { return !kv.fail.Load() }, 5*time.Second, time.Millisecond, "the record's write failed")
	require.NoError(t, blockUntil(t, clock), "the commit failed: Run pauses on the clock")
	e, err := bucket.Get(ctx, CursorKey("s", 0))
	require.NoError(t, err)
	c, err := record.DecodeCursor(e.Value())
	require.NoError(t, err)
	require.Equal(t, uint64(12), c.Streams["order-1"].Seq, "the cursor key was written")
	require.True(t, pending(w), "not released: the record was not")
	require.False(t, coveredNow(p, "s", "order-1", 12))

	clock.Advance(time.Second)
	require.NoError(t, <-w, "released by the commit that went again")
	require.True(t, coveredNow(p, "s", "order-1", 12))
}
