package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// listener is a LISTEN connection on a store's channel.
type listener struct {
	conn    *pgx.Conn
	channel string
}

// listen opens a listener on channel (a store's schema) that holds the
// store's idle lock, as a drainer waiting for notifications does: appends
// notify only while one does (migration 006).
func listen(t *testing.T, channel string) listener {
	t.Helper()
	l := listenOnly(t, channel)
	_, err := l.conn.Exec(t.Context(), "SELECT pg_advisory_lock(hashtextextended('jsbridge idle ' || $1, 0))", channel)
	require.NoError(t, err)
	return l
}

// listenOnly opens a listener on channel that holds no idle lock.
func listenOnly(t *testing.T, channel string) listener {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(t.Context(), "LISTEN "+channel)
	require.NoError(t, err)
	return listener{conn: conn, channel: channel}
}

// next returns the payload of the next notification ("" is the trigger's).
func (l listener) next(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	n, err := l.conn.WaitForNotification(ctx)
	require.NoError(t, err, "no notification")
	return n.Payload
}

// notified reports whether what pool ran since the last call notified the
// channel: it sends a marker after it, and notifications arrive in commit
// order, so the marker comes first exactly when nothing else was sent.
func (l listener) notified(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	_, err := pool.Exec(t.Context(), "SELECT pg_notify($1, 'marker')", l.channel)
	require.NoError(t, err)
	if l.next(t) == "marker" {
		return false
	}
	require.Equal(t, "marker", l.next(t), "one notification, then the marker")
	return true
}

// The trigger notifies when an append makes a caught-up or new stream
// pending and a claim can take it, and only then: not for a stream already pending,
// one a drainer holds (it claims again after settling), nor for one
// blocked or in backoff.
func TestAppendNotifiesOnlyWhenAClaimCanAct(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())

	b.appendN(t, "w-1", 1)
	require.True(t, l.notified(t, b.pool), "a new stream")
	// Until a fold takes in a new stream's markers (its first claim's),
	// it has no row to say it is pending (migration 010).
	b.appendN(t, "w-1", 1)
	require.True(t, l.notified(t, b.pool), "a new stream, not yet taken in")
	require.NoError(t, store.Fold(b.ctx, b.store))
	b.appendN(t, "w-1", 1)
	require.False(t, l.notified(t, b.pool), "already pending")

	claims, err := b.store.Claim(b.ctx, "d1", 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	b.appendN(t, "w-1", 1)
	require.False(t, l.notified(t, b.pool), "held by a live lease")

	evs, err := b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	last := evs[len(evs)-1]
	require.NoError(t, b.store.Ack(b.ctx, "d1", "w-1", last.Version, last.ID))
	b.appendN(t, "w-1", 1)
	require.True(t, l.notified(t, b.pool), "caught up by the ack, then pending")

	// Caught up, and in backoff or blocked: no claim could take it.
	claims, err = b.store.Claim(b.ctx, "d1", 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	evs, err = b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	last = evs[len(evs)-1]
	require.NoError(t, b.store.Retry(b.ctx, "d1", "w-1", last.Version, last.ID, time.Hour, "endpoint down"))
	b.appendN(t, "w-1", 1)
	require.False(t, l.notified(t, b.pool), "in backoff")

	_, err = b.pool.Exec(b.ctx, "UPDATE "+b.store.Schema()+".streams SET watermark = head, next_attempt = NULL, blocked = true WHERE stream = 'w-1'")
	require.NoError(t, err)
	b.appendN(t, "w-1", 1)
	require.False(t, l.notified(t, b.pool), "blocked")

	b.appendN(t, "w-2", 1)
	require.True(t, l.notified(t, b.pool), "another stream, caught up")
}

// An append to a stream a drainer holds sends no notification, yet it is
// drained at once: the holder settles the stream with the new event past
// its watermark and, having claimed something, claims again without
// waiting. The poll interval is an hour, so only that can drain it.
func TestAppendToAHeldStreamIsDrainedWithoutNotification(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a drain against Postgres")
	}
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())
	first := b.appendN(t, "held-1", 1)[0]
	require.True(t, l.notified(t, b.pool))

	inHandler := make(chan struct{})
	proceed := make(chan struct{})
	var mu sync.Mutex
	var handled []int64
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		for i, bt := range batches {
			mu.Lock()
			for _, e := range bt.Events {
				handled = append(handled, e.Version)
			}
			mu.Unlock()
			if bt.Events[0].ID == first.ID {
				close(inHandler)
				<-proceed
			}
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		return out
	})
	d, err := drain.New(b.store, h, drain.Config{Notifier: b.store, PollInterval: time.Hour})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	<-inHandler // the drain holds held-1's lease
	b.appendN(t, "held-1", 1)
	close(proceed)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 2
	}, 10*time.Second, 5*time.Millisecond, "the second event was not drained")
	mu.Lock()
	require.Equal(t, []int64{0, 1}, handled)
	mu.Unlock()
	// Checked after the drain did its work: the check's own marker would
	// wake it.
	require.False(t, l.notified(t, b.pool), "the append to a held stream notified")
}

// An append to a stream already pending sends no notification. If the
// drain's claim comes while that append's transaction is still open, the
// claim passes over the stream (its row is locked) and the store wakes the
// drain again shortly, so the event is drained once the transaction
// commits, although the poll interval is an hour.
func TestAppendHeldOpenPastAClaimIsDrainedWithoutNotification(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a drain against Postgres")
	}
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())

	var mu sync.Mutex
	var handled []int64
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		mu.Lock()
		defer mu.Unlock()
		for i, bt := range batches {
			for _, e := range bt.Events {
				handled = append(handled, e.Version)
			}
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		return out
	})
	seen := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), handled...)
	}

	// Pending before the drain starts, with no notification left to wake
	// it: only the drain's first claim can take it.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = b.store.AppendTx(b.ctx, tx, "open-1", store.AnyVersion, ev("E", `{}`))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.True(t, l.notified(t, b.pool))
	require.NoError(t, store.Fold(b.ctx, b.store)) // its marker: the row

	// A second append holds the stream's row until the test commits it.
	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.store.AppendTx(b.ctx, tx, "open-1", store.AnyVersion, ev("E", `{}`))
	require.NoError(t, err)

	obs := &claimCounter{}
	d, err := drain.New(b.store, h, drain.Config{Notifier: b.store, PollInterval: time.Hour, Observer: obs})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	// The drain's claims pass over the locked row; once the append
	// commits, its stream is drained whole.
	require.Eventually(t, func() bool { return obs.empty.Load() > 0 }, 10*time.Second, time.Millisecond,
		"no claim passed over the locked stream")
	require.Empty(t, seen())
	require.NoError(t, tx.Commit(b.ctx))
	require.Eventually(t, func() bool { return len(seen()) == 2 }, 10*time.Second, 5*time.Millisecond,
		"the stream was not drained after its appender committed")
	require.Equal(t, []int64{0, 1}, seen())
	// Checked after the drain did its work: the check's own marker would
	// wake it.
	require.False(t, l.notified(t, b.pool), "the append to a pending stream notified")
}

// Streams given back at shutdown may hold appends that sent no
// notification (they were pending, or held): Release notifies, so idle
// drainers take them at once instead of at their next poll.
func TestReleaseNotifies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())
	b.appendN(t, "rel-1", 1)
	require.True(t, l.notified(t, b.pool))
	claims, err := b.store.Claim(b.ctx, "d1", 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	b.appendN(t, "rel-1", 1)
	require.False(t, l.notified(t, b.pool), "held by a live lease")
	require.NoError(t, b.store.Release(b.ctx, "d1", []string{"rel-1"}))
	require.True(t, l.notified(t, b.pool), "given back")
}

// Unblock and reset make streams claimable with no append to notify: they
// notify the store's channel themselves.
func TestUnblockAndResetNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())
	b.appendN(t, "ub-1", 1)
	require.True(t, l.notified(t, b.pool))
	require.NoError(t, store.Fold(b.ctx, b.store)) // its marker: the row
	_, err := b.pool.Exec(b.ctx, "UPDATE "+b.store.Schema()+".streams SET blocked = true WHERE stream = 'ub-1'")
	require.NoError(t, err)
	changed, err := b.store.Unblock(b.ctx, []string{"ub-1"})
	require.NoError(t, err)
	require.Len(t, changed, 1)
	require.True(t, l.notified(t, b.pool), "unblocked")
	changed, err = b.store.Reset(b.ctx, []string{"ub-1"})
	require.NoError(t, err)
	require.Len(t, changed, 1)
	require.True(t, l.notified(t, b.pool), "reset")
	changed, err = b.store.Unblock(b.ctx, []string{"ub-1"})
	require.NoError(t, err)
	require.Empty(t, changed)
	require.False(t, l.notified(t, b.pool), "nothing changed")
}

// The trigger takes one way for a statement inserting one stream's events
// and another for a statement inserting several streams' (migration 007):
// both move each stream's head to its last version, set pending_since
// only when the stream goes from caught up to pending, and notify exactly
// when a caught-up stream becomes pending; a statement inserting nothing
// changes nothing.
func TestTriggerOneAndSeveralStreamsPerStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := listen(t, b.store.Schema())
	insert := func(rows string) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".events (stream, version, name, data, created) "+rows)
		require.NoError(t, err)
	}
	since := func(stream string) time.Time {
		t.Helper()
		var at time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT pending_since FROM "+b.store.Schema()+".streams WHERE stream = $1", stream).Scan(&at))
		return at
	}
	past := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	insert("SELECT 'one-1', v, 'E', '{}', now() FROM generate_series(0, 2) v WHERE false")
	require.False(t, l.notified(t, b.pool), "nothing inserted")

	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".events (stream, version, name, data, created) SELECT 'one-1', v, 'E', '{}', $1::timestamptz FROM generate_series(0, 2) v", past)
	require.NoError(t, err)
	require.True(t, l.notified(t, b.pool), "one stream, new")
	require.Equal(t, int64(2), b.info(t, "one-1").Head)
	require.True(t, since("one-1").Equal(past), "pending since its oldest event")

	insert("VALUES ('one-1', 3, 'E', '{}', now()), ('one-1', 4, 'E', '{}', now())")
	require.False(t, l.notified(t, b.pool), "one stream, already pending")
	require.Equal(t, int64(4), b.info(t, "one-1").Head)
	require.True(t, since("one-1").Equal(past), "still pending since its oldest unforwarded event")

	insert("VALUES ('two-b', 0, 'E', '{}', now()), ('two-a', 0, 'E', '{}', now()), ('two-b', 1, 'E', '{}', now())")
	require.True(t, l.notified(t, b.pool), "two streams, new")
	require.Equal(t, int64(0), b.info(t, "two-a").Head)
	require.Equal(t, int64(1), b.info(t, "two-b").Head)

	insert("VALUES ('two-a', 1, 'E', '{}', now()), ('one-1', 5, 'E', '{}', now())")
	require.False(t, l.notified(t, b.pool), "two streams, both pending")
	require.Equal(t, int64(1), b.info(t, "two-a").Head)
	require.Equal(t, int64(5), b.info(t, "one-1").Head)

	_, err = b.pool.Exec(b.ctx, "UPDATE "+b.store.Schema()+".streams SET watermark = head WHERE stream = 'two-a'")
	require.NoError(t, err)
	insert("VALUES ('two-a', 2, 'E', '{}', now()), ('one-1', 6, 'E', '{}', now())")
	require.True(t, l.notified(t, b.pool), "two streams, one caught up until now")
	require.Equal(t, int64(2), b.info(t, "two-a").Head)
	require.True(t, since("one-1").Equal(past), "the pending one keeps its pending_since")
}
