package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// rowVersion is the transaction that wrote the current version of
// stream's row in the streams table: a row lock (an append to a pending
// stream) leaves it as it was, a write changes it.
func (b bundle) rowVersion(t *testing.T, stream string) string {
	t.Helper()
	var xmin string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM `+b.store.Schema()+`.streams WHERE stream = $1`, stream).Scan(&xmin))
	return xmin
}

// keptPending reads whether the ack kept stream pending (migration 009).
func (b bundle) keptPending(t *testing.T, stream string) bool {
	t.Helper()
	var keep bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT keep_pending FROM `+b.store.Schema()+`.streams WHERE stream = $1`, stream).Scan(&keep))
	return keep
}

// drainOnce claims stream alone for owner "k", fetches its events and
// acks the last: it returns the versions it fetched.
func (b bundle) drainOnce(t *testing.T, stream string) []int64 {
	t.Helper()
	claims, err := b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, stream, claims[0].Stream)
	evs, err := b.store.Fetch(b.ctx, claims, 100)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	last := evs[len(evs)-1]
	require.NoError(t, b.store.Ack(b.ctx, "k", stream, last.Version, last.ID))
	var vs []int64
	for _, e := range evs {
		vs = append(vs, e.Version)
	}
	return vs
}

// An ack that catches a stream up keeps it pending (in the claim's
// index), and the stream's next append then writes nothing to the streams
// table; meanwhile the stream counts as caught up everywhere and no claim
// takes it, and once an event is past its watermark it counts as lagging
// and the next claim takes it.
func TestAckKeepsACaughtUpStreamPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetKeepPending(b.store, time.Hour)

	b.appendN(t, "kept-1", 2)
	since := pendingSince(t, b, "kept-1")
	require.Equal(t, []int64{0, 1}, b.drainOnce(t, "kept-1"))
	require.Equal(t, since, pendingSince(t, b, "kept-1"),
		"pending since less than the keep-pending time: left as it was (nothing indexed moves)")
	head, pending := b.streamsRow(t, "kept-1")
	require.Equal(t, int64(1), head)
	require.True(t, pending, "kept in the claim's index")
	require.True(t, b.keptPending(t, "kept-1"))

	// Caught up everywhere a reader looks.
	claims, err := b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, claims, "nothing past the watermark: not claimed")
	si := b.info(t, "kept-1")
	require.Equal(t, int64(1), si.Head)
	require.Zero(t, si.Lag)
	require.Zero(t, si.LagAge)
	lagging, err := b.store.Streams(b.ctx, store.StreamFilter{Lagging: true})
	require.NoError(t, err)
	require.Empty(t, lagging)
	bl, err := b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.Zero(t, bl.Lagging)
	require.Zero(t, bl.OldestAge)
	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), appended)
	require.Equal(t, int64(2), forwarded)

	// The next appends write no row.
	before := b.rowVersion(t, "kept-1")
	b.appendN(t, "kept-1", 2)
	require.Equal(t, before, b.rowVersion(t, "kept-1"), "an append to a stream kept pending wrote its streams row")
	head, _ = b.streamsRow(t, "kept-1")
	require.Equal(t, int64(1), head, "the head column is a lower bound")

	si = b.info(t, "kept-1")
	require.Equal(t, int64(3), si.Head)
	require.Equal(t, int64(2), si.Lag)
	require.Positive(t, si.LagAge)
	lagging, err = b.store.Streams(b.ctx, store.StreamFilter{Lagging: true})
	require.NoError(t, err)
	require.Len(t, lagging, 1)
	bl, err = b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), bl.Lagging)
	appended, _, err = b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), appended)

	require.Equal(t, []int64{2, 3}, b.drainOnce(t, "kept-1"))
	require.True(t, b.keptPending(t, "kept-1"))

	// Reset re-publishes from the first event: lagging by all of them.
	b.appendN(t, "kept-1", 1)
	reset, err := b.store.Reset(b.ctx, []string{"kept-1"})
	require.NoError(t, err)
	require.Equal(t, []store.Changed{{Stream: "kept-1", Watermark: 3, Head: 4}}, reset)
	require.Equal(t, int64(5), b.info(t, "kept-1").Lag)
	require.Equal(t, []int64{0, 1, 2, 3, 4}, b.drainOnce(t, "kept-1"))
}

// A claim takes out of the claim's index a stream the ack kept pending
// once it lingered the store's keep-pending time with no event past its
// watermark; its next append then makes it pending as an append to a
// caught-up stream does (it writes the row).
func TestClaimTakesOutAStreamKeptPendingWithNothingNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetKeepPending(b.store, time.Hour)

	b.appendN(t, "out-1", 1)
	b.drainOnce(t, "out-1")
	claims, err := b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, claims)
	_, pending := b.streamsRow(t, "out-1")
	require.True(t, pending, "lingered less than the keep-pending time: still in the index")

	store.SetKeepPending(b.store, 0)
	claims, err = b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, claims)
	_, pending = b.streamsRow(t, "out-1")
	require.False(t, pending, "taken out by the claim that found nothing new")
	require.False(t, b.keptPending(t, "out-1"))

	// ClaimFetch and AckClaim take streams out too.
	b.appendN(t, "out-2", 1)
	b.drainOnce(t, "out-2")
	b.appendN(t, "out-3", 1)
	b.drainOnce(t, "out-3")
	_, evs, err := b.store.ClaimFetch(b.ctx, "k", 10, time.Minute, 10)
	require.NoError(t, err)
	require.Empty(t, evs)
	_, pending = b.streamsRow(t, "out-2")
	require.False(t, pending, "ClaimFetch")
	b.appendN(t, "out-4", 1)
	claims, err = b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	_, pending = b.streamsRow(t, "out-3")
	require.False(t, pending, "Claim")
	evs, err = b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	ackErrs, claims, _, _, err := b.store.AckClaim(b.ctx, "k", []event.Progress{{Stream: "out-4", Version: 0, ID: evs[0].ID}}, 10, time.Minute, 10)
	require.NoError(t, err)
	require.NoError(t, ackErrs[0])
	require.Empty(t, claims)
	_, pending = b.streamsRow(t, "out-4")
	require.True(t, pending, "acked in the claim's own transaction: it has not lingered yet")

	before := b.rowVersion(t, "out-1")
	b.appendN(t, "out-1", 1)
	require.NotEqual(t, before, b.rowVersion(t, "out-1"), "made pending again: the append writes the row")
	_, pending = b.streamsRow(t, "out-1")
	require.True(t, pending)
	require.Equal(t, []int64{1}, b.drainOnce(t, "out-1"))
}

// An append to a stream kept pending notifies a drainer that waits for
// notifications, as an append to a caught-up stream does, and none while
// the stream is held by a live lease.
func TestAppendToAStreamKeptPendingWakesAnIdleDrainer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetKeepPending(b.store, time.Hour)
	l := listen(t, b.store.Schema())

	b.appendN(t, "wk-1", 1)
	require.True(t, l.notified(t, b.pool), "a new stream")
	b.drainOnce(t, "wk-1")
	_, pending := b.streamsRow(t, "wk-1")
	require.True(t, pending)
	b.appendN(t, "wk-1", 1)
	require.True(t, l.notified(t, b.pool), "kept pending, caught up: a claim needs waking")

	claims, err := b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	b.appendN(t, "wk-1", 1)
	require.False(t, l.notified(t, b.pool), "held by a live lease")
}

// A drain over streams the acks keep pending goes idle once they are
// caught up (it does not keep claiming them) and wakes for an append to
// one of them although its poll interval is an hour.
func TestDrainIdlesOverStreamsKeptPending(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a drain against Postgres")
	}
	t.Parallel()
	b := setup(t)
	store.SetKeepPending(b.store, time.Hour)

	var mu sync.Mutex
	handled := map[string][]int64{}
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		mu.Lock()
		defer mu.Unlock()
		for i, bt := range batches {
			for _, e := range bt.Events {
				handled[e.Stream] = append(handled[e.Stream], e.Version)
			}
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		return out
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, vs := range handled {
			n += len(vs)
		}
		return n
	}
	obs := &claimCounter{}
	d, err := drain.New(b.store, h, drain.Config{Notifier: b.store, PollInterval: time.Hour, Observer: obs})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	idle := func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
  AND (classid::bigint << 32 | objid::bigint) = hashtextextended('jsbridge idle ' || $1, 0)`, b.store.Schema()).Scan(&n))
		return n > 0
	}
	for i := range 5 {
		b.appendN(t, "idle-"+string(rune('0'+i)), 1)
	}
	require.Eventually(t, func() bool { return count() == 5 }, 10*time.Second, 5*time.Millisecond, "drained")
	require.Eventually(t, idle, 10*time.Second, 5*time.Millisecond, "the drain did not go idle over streams kept pending")
	var kept int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.store.Schema()+`.streams WHERE pending AND keep_pending`).Scan(&kept))
	require.Equal(t, 5, kept)
	claims := obs.claims.Load()

	b.appendN(t, "idle-2", 1)
	require.Eventually(t, func() bool { return count() == 6 }, 10*time.Second, 5*time.Millisecond,
		"an append to a stream kept pending was not drained")
	mu.Lock()
	require.Equal(t, []int64{0, 1}, handled["idle-2"])
	mu.Unlock()
	require.Eventually(t, idle, 10*time.Second, 5*time.Millisecond, "idle again")
	require.Less(t, obs.claims.Load()-claims, int64(10), "a few claims for one append")
}

// The claim's take-out reads the events past a stream's watermark in a
// snapshot from before it locked the stream's row: an append that found
// the stream pending (and so wrote nothing) and committed in between is
// not seen there. The statement that follows it in the claim's
// transaction looks again and makes such a stream pending: without it,
// the event would wait for the stream's next append.
func TestTakeOutLooksAgainForAnAppendItsSnapshotMissed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetKeepPending(b.store, 0)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	// Inserts without the trigger: what an appender that found the stream
	// pending leaves behind (the row untouched) once it has committed.
	_, err = conn.Exec(b.ctx, "SET session_replication_role = replica")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.Background(), "RESET session_replication_role") }()
	missed := func(stream string) func() error {
		return func() error {
			_, err := conn.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".events (stream, version, name, data) VALUES ($1, 1, 'E', '{}')", stream)
			return err
		}
	}

	for _, c := range []struct {
		stream  string
		catchUp bool
	}{{"missed-2", false}, {"missed-1", true}} {
		b.appendN(t, c.stream, 1)
		b.drainOnce(t, c.stream)
		require.NoError(t, store.TakeOut(b.ctx, b.store, missed(c.stream), c.catchUp))
		_, pending := b.streamsRow(t, c.stream)
		require.Equal(t, c.catchUp, pending, "%s: pending after the take-out", c.stream)
	}
	claims, err := b.store.Claim(b.ctx, "k", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1, "missed-2 stays out of the claim's index: what the second look is for")
	require.Equal(t, "missed-1", claims[0].Stream)
	evs, err := b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, int64(1), evs[0].Version)
}
