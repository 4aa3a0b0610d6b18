package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// streamsRow reads the head column and the pending flag of stream's row
// as stored (Streams reports the real head).
func (b bundle) streamsRow(t *testing.T, stream string) (head int64, pending bool) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT head, pending FROM `+b.store.Schema()+`.streams WHERE stream = $1`, stream).Scan(&head, &pending))
	return head, pending
}

// claimedWithAppendOpen appends one event to stream s-1, claims it for
// drainer "x", and opens a transaction that appends its next event
// without committing: the test commits it (or its cleanup rolls it
// back). It returns the claimed event and the open transaction.
func (b bundle) claimedWithAppendOpen(t *testing.T) (event.Event, pgx.Tx) {
	t.Helper()
	first := b.appendN(t, "s-1", 1)[0]
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.store.AppendTx(b.ctx, tx, "s-1", store.AnyVersion, ev("Happened", `{"n":1}`))
	require.NoError(t, err)
	return first, tx
}

// waitForLockWaiter waits until some session of the database waits for a
// lock.
func (b bundle) waitForLockWaiter(t *testing.T, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, what)
}

// While a drainer waits, an append to a stream that is already pending
// writes nothing to the streams table (migration 008): its head column
// stays where the append that made it pending left it, and Streams, Totals
// and Reset read the real head from the events table.
func TestAppendToAPendingStreamWritesNoStreamsRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listen(t, b.store.Schema()) // a drainer waits: appends take 008's way
	// One connection: its statistics are flushed on demand below.
	cfg, err := pgxpool.ParseConfig(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := store.New(pool, store.WithSchema(b.store.Schema()))
	require.NoError(t, err)

	for i := range 21 { // the first's marker, folded, creates the row: pending
		_, err := s.Append(b.ctx, "quiet-1", store.AnyVersion, ev("E", `{}`))
		require.NoError(t, err)
		if i == 0 {
			require.NoError(t, store.Fold(b.ctx, s))
		}
	}
	_, err = pool.Exec(b.ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	_, err = pool.Exec(b.ctx, "SELECT 1") // a transaction end: the flush
	require.NoError(t, err)
	var upd int64
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT n_tup_upd FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'streams'`, s.Schema()).Scan(&upd))
	require.Zero(t, upd, "no update of the streams row")
	head, pending := b.streamsRow(t, "quiet-1")
	require.Equal(t, int64(0), head, "the head column is a lower bound")
	require.True(t, pending)

	si := b.info(t, "quiet-1")
	require.Equal(t, int64(20), si.Head)
	require.Equal(t, int64(21), si.Lag)
	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(21), appended)
	require.Zero(t, forwarded)
	lagging, err := b.store.Streams(b.ctx, store.StreamFilter{Lagging: true})
	require.NoError(t, err)
	require.Len(t, lagging, 1)

	// Acked to the last version: caught up, the head column exact again.
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	evs, err := b.store.Fetch(b.ctx, claims, 100)
	require.NoError(t, err)
	require.Len(t, evs, 21, "the fetch reads the events table, not the head column")
	require.NoError(t, b.store.Ack(b.ctx, "x", "quiet-1", evs[20].Version, evs[20].ID))
	head, pending = b.streamsRow(t, "quiet-1")
	require.Equal(t, int64(20), head)
	require.False(t, pending)
	si = b.info(t, "quiet-1")
	require.Equal(t, int64(20), si.Head)
	require.Zero(t, si.Lag)

	// Reset counts the real head too.
	b.appendN(t, "quiet-1", 3)
	reset, err := b.store.Reset(b.ctx, []string{"quiet-1"})
	require.NoError(t, err)
	require.Equal(t, []store.Changed{{Stream: "quiet-1", Watermark: 20, Head: 23}}, reset)
	require.Equal(t, int64(24), b.info(t, "quiet-1").Lag)
}

// While a drainer waits, a settle that moves the watermark to the last
// event it saw while an append to the stream, which found it pending and
// wrote nothing, has not committed yet waits for that append's lock and
// leaves the stream pending for the appended event: the ack, a block at
// the last event (taken again after unblock), and AckClaim's claim taking
// it again.
func TestSettleWaitsForAnAppendThatSkippedTheRow(t *testing.T) {
	t.Parallel()
	settles := []struct {
		name   string
		settle func(b bundle, e event.Event) error
	}{
		{"ack", func(b bundle, e event.Event) error { return b.store.Ack(b.ctx, "x", e.Stream, e.Version, e.ID) }},
		{"acks", func(b bundle, e event.Event) error {
			return errorsOf(b.store.AckStreams(b.ctx, "x", []event.Progress{{Stream: e.Stream, Version: e.Version, ID: e.ID}}))
		}},
		{"block", func(b bundle, e event.Event) error {
			if err := b.store.Block(b.ctx, "x", e.Stream, e.Version, e.ID, "refused after it"); err != nil {
				return err
			}
			_, err := b.store.Unblock(b.ctx, []string{e.Stream})
			return err
		}},
		{"retry", func(b bundle, e event.Event) error {
			return b.store.Retry(b.ctx, "x", e.Stream, e.Version, e.ID, 0, "failed after it")
		}},
	}
	for _, c := range settles {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			listen(t, b.store.Schema()) // a drainer waits: appends take 008's way
			first, tx := b.claimedWithAppendOpen(t)
			head, _ := b.streamsRow(t, "s-1")
			require.Equal(t, int64(0), head, "the append found the stream pending: no write")

			done := make(chan error, 1)
			go func() { done <- c.settle(b, first) }()
			b.waitForLockWaiter(t, "the settle waits for the appender's row")
			require.NoError(t, tx.Commit(b.ctx))
			require.NoError(t, <-done)

			si := b.info(t, "s-1")
			require.Equal(t, int64(0), si.Watermark)
			require.Equal(t, int64(1), si.Head)
			require.Equal(t, int64(1), si.Lag, "pending for the event committed while the settle waited")
			claims, err := b.store.Claim(b.ctx, "y", 10, time.Minute)
			require.NoError(t, err)
			require.Equal(t, []string{"s-1"}, claimedNames(claims), "claimable again")
			evs, err := b.store.Fetch(b.ctx, claims, 10)
			require.NoError(t, err)
			require.Len(t, evs, 1)
			require.Equal(t, int64(1), evs[0].Version)
		})
	}
}

func errorsOf(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// While a drainer waits, an append that waited for a settle holding the
// stream's row reads the row as the settle left it: caught up, so it
// writes the row and makes the stream pending (and claimable) again.
func TestAppendWaitingForASettleMarksTheStreamPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listen(t, b.store.Schema()) // a drainer waits: appends take 008's way
	first := b.appendN(t, "s-1", 1)[0]
	require.NoError(t, store.Fold(b.ctx, b.store)) // its marker: the row
	// A settle in progress: the stream's row updated and held.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `UPDATE `+b.store.Schema()+`.streams SET watermark = $2, head = GREATEST(head, $2) WHERE stream = $1`, "s-1", first.Version)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := b.store.Append(b.ctx, "s-1", store.AnyVersion, ev("Happened", `{"n":1}`))
		done <- err
	}()
	b.waitForLockWaiter(t, "the append waits for the settle's row")
	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-done)

	head, pending := b.streamsRow(t, "s-1")
	require.Equal(t, int64(1), head, "the append wrote the row")
	require.True(t, pending)
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"s-1"}, claimedNames(claims))
	require.Equal(t, int64(0), claims[0].Watermark)
}

// Appenders and two drains at once over a few hot streams, with appends
// made inside transactions that do more before they commit: every event
// is handled exactly once and in version order, and afterwards every
// stream is caught up, its real head its last version.
func TestConcurrentAppendersAndDrainsMissNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two drains against Postgres")
	}
	t.Parallel()
	b := setup(t)
	const (
		streams   = 8
		appenders = 6
		perWriter = 60
	)
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
	ctx, cancel := context.WithCancel(b.ctx)
	var ran sync.WaitGroup
	for i := range 2 {
		d, err := drain.New(b.store, h, drain.Config{Owner: fmt.Sprintf("d%d", i), Notifier: b.store, PollInterval: time.Hour, ClaimLimit: 3, FetchLimit: 4})
		require.NoError(t, err)
		ran.Add(1)
		go func() { defer ran.Done(); _ = d.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); ran.Wait() })

	var wg sync.WaitGroup
	errs := make(chan error, appenders)
	for w := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; {
				stream := fmt.Sprintf("hot-%d", (w+i)%streams)
				err := b.appendSome(stream, i%3 == 0)
				var conflict *store.ConcurrencyError
				switch {
				case errors.As(err, &conflict):
					continue // another appender took the version: again
				case err != nil:
					errs <- err
					return
				}
				i++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	total := appenders * perWriter
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, vs := range handled {
			n += len(vs)
		}
		return n >= total
	}, 30*time.Second, 10*time.Millisecond, "every event drained")
	mu.Lock()
	n := 0
	for stream, vs := range handled {
		for i, v := range vs {
			require.Equal(t, int64(i), v, "stream %s: handled once each, in order", stream)
		}
		n += len(vs)
	}
	mu.Unlock()
	require.Equal(t, total, n)
	require.Eventually(t, func() bool {
		lagging, err := b.store.Streams(b.ctx, store.StreamFilter{Lagging: true})
		require.NoError(t, err)
		return len(lagging) == 0
	}, 10*time.Second, 10*time.Millisecond, "every stream caught up")
	all, err := b.store.Streams(b.ctx, store.StreamFilter{})
	require.NoError(t, err)
	require.Len(t, all, streams)
	for _, si := range all {
		require.Equal(t, int64(len(handled[si.Stream])-1), si.Head, si.Stream)
		require.Equal(t, si.Head, si.Watermark, si.Stream)
	}
	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(total), appended)
	require.Equal(t, int64(total), forwarded)
}

// appendSome appends one event to stream, alone or (inTx false) in a
// transaction that does more of the app's work before it commits.
func (b bundle) appendSome(stream string, alone bool) error {
	if alone {
		_, err := b.store.Append(b.ctx, stream, store.AnyVersion, ev("E", `{}`))
		return err
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := b.store.AppendTx(b.ctx, tx, stream, store.AnyVersion, ev("E", `{}`)); err != nil {
		return err
	}
	if _, err := tx.Exec(b.ctx, `SELECT count(*) FROM generate_series(1, 20000)`); err != nil {
		return err
	}
	return tx.Commit(b.ctx)
}

// While a drainer waits, AckClaim acking a stream while an append to it,
// which found it pending and wrote nothing, has not committed yet waits
// for that append's lock; its fold, which does the catch-up of the acked
// streams, then finds the appended event, and its claim takes the stream
// again with that event (the claim alone, and the claim with its fetch).
func TestAckClaimTakesAgainAnAppendThatSkippedTheRow(t *testing.T) {
	t.Parallel()
	for _, perStream := range []int{0, 10} {
		t.Run(fmt.Sprintf("perStream=%d", perStream), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			listen(t, b.store.Schema()) // a drainer waits: appends take 008's way
			first, tx := b.claimedWithAppendOpen(t)

			type result struct {
				ackErrs []error
				claims  []event.Claim
				events  []event.Event
				err     error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.ackErrs, r.claims, r.events, _, r.err = b.store.AckClaim(b.ctx, "x",
					[]event.Progress{{Stream: first.Stream, Version: first.Version, ID: first.ID}}, 10, time.Minute, perStream)
				done <- r
			}()
			b.waitForLockWaiter(t, "the ack waits for the appender's row")
			require.NoError(t, tx.Commit(b.ctx))
			r := <-done
			require.NoError(t, r.err)
			require.NoError(t, errorsOf(r.ackErrs))
			require.Equal(t, []string{"s-1"}, claimedNames(r.claims), "claimed again for the event committed while the ack waited")
			require.Equal(t, int64(0), r.claims[0].Watermark)
			if perStream > 0 {
				require.Len(t, r.events, 1)
				require.Equal(t, int64(1), r.events[0].Version)
			}
		})
	}
}
