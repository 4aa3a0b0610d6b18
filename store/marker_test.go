package store_test

import (
	"bytes"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// markers counts the rows of the appended table (migration 009).
func (b bundle) markers(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+b.store.Schema()+".appended").Scan(&n))
	return n
}

// streamsRows counts the rows of the streams table.
func (b bundle) streamsRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+b.store.Schema()+".streams").Scan(&n))
	return n
}

// While no drainer waits, an append writes one marker per event and
// touches no streams row; a claim takes the markers into the streams
// table first and claims the streams, and the readers (Streams, Totals,
// Backlog) count every committed event. A statement inserting several
// streams' events writes a marker for each.
func TestAppendWritesAMarkerWhileNoDrainerWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "m-1", 2)
	b.appendN(t, "m-1", 1)
	b.appendN(t, "m-2", 1)
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+`.events (stream, version, name, data)
VALUES ('m-3', 0, 'E', '{}'), ('m-4', 0, 'E', '{}'), ('m-3', 1, 'E', '{}')`)
	require.NoError(t, err)
	require.Equal(t, 7, b.markers(t))
	require.Zero(t, b.streamsRows(t), "no streams row written by an append")

	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(7), appended)
	require.Zero(t, forwarded)
	require.Zero(t, b.markers(t), "taken in by the reader")
	require.Equal(t, int64(2), b.info(t, "m-1").Head)
	require.Equal(t, int64(3), b.info(t, "m-1").Lag)

	b.appendN(t, "m-5", 1)
	bl, err := b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, bl.Lagging)

	b.appendN(t, "m-6", 1)
	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"m-1", "m-2", "m-3", "m-4", "m-5", "m-6"}, claimedNames(claims))
	require.Zero(t, b.markers(t))
}

// A settle that runs while an append (a marker, no row lock) has not
// committed does not wait for it and leaves the stream caught up as far
// as it saw; the next claim takes the marker in and the stream again:
// with Claim, ClaimFetch, and AckClaim's claim after its own acks.
func TestSettleBesideAMarkerLeavesTheStreamClaimable(t *testing.T) {
	t.Parallel()
	claimers := []struct {
		name  string
		claim func(b bundle) ([]event.Claim, error)
	}{
		{"claim", func(b bundle) ([]event.Claim, error) { return b.store.Claim(b.ctx, "y", 10, time.Minute) }},
		{"claimfetch", func(b bundle) ([]event.Claim, error) {
			c, _, err := b.store.ClaimFetch(b.ctx, "y", 10, time.Minute, 10)
			return c, err
		}},
	}
	for _, c := range claimers {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			first, tx := b.claimedWithAppendOpen(t)
			require.NoError(t, b.store.Ack(b.ctx, "x", "s-1", first.Version, first.ID), "no wait for the appender")
			require.NoError(t, tx.Commit(b.ctx))

			claims, err := c.claim(b)
			require.NoError(t, err)
			require.Equal(t, []string{"s-1"}, claimedNames(claims), "claimable for the event appended beside the ack")
			require.Equal(t, int64(0), claims[0].Watermark)
		})
	}
	t.Run("ackclaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.appendN(t, "s-1", 1)[0]
		_, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
		require.NoError(t, err)
		b.appendN(t, "s-1", 1) // committed before the acks: the claim with them takes it
		errs, claims, _, again, err := b.store.AckClaim(b.ctx, "x", []event.Progress{{Stream: "s-1", Version: first.Version, ID: first.ID}}, 10, time.Minute, 10)
		require.NoError(t, err)
		require.Equal(t, []error{nil}, errs)
		require.False(t, again)
		require.Equal(t, []string{"s-1"}, claimedNames(claims))
		require.Equal(t, int64(0), claims[0].Watermark)
	})
}

// A claim never waits for a streams row another transaction holds: the
// fold leaves that stream's markers for a later claim, which takes them
// once the row is free.
func TestFoldLeavesMarkersOfARowHeldElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "h-1", 1)
	require.NoError(t, store.Fold(b.ctx, b.store))
	_, err := b.pool.Exec(b.ctx, "UPDATE "+b.store.Schema()+".streams SET watermark = head WHERE stream = 'h-1'")
	require.NoError(t, err)
	b.appendN(t, "h-1", 1)
	b.appendN(t, "h-2", 1)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, "SELECT 1 FROM "+b.store.Schema()+".streams WHERE stream = 'h-1' FOR UPDATE")
	require.NoError(t, err)

	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"h-2"}, claimedNames(claims), "h-1's row is held: its marker waits")
	require.Equal(t, 1, b.markers(t))

	require.NoError(t, tx.Rollback(b.ctx))
	claims, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"h-1"}, claimedNames(claims))
	require.Equal(t, int64(0), claims[0].Watermark)
	require.Zero(t, b.markers(t))
}

// An appender and a fold never close a deadlock cycle over a new stream
// (migration 010). The fold holds the row of a stream it takes in (dl-b)
// and takes in a new stream (dl-a, a marker only); an application
// transaction, while a drainer waits, appends to dl-a and then to dl-b.
// When the append inserted dl-a's row, the fold waited for it while
// holding dl-b, and the append's second statement waited for dl-b: a
// cycle, in which Postgres cancelled one of them. The append now writes a
// marker for a stream without a row, so the fold never waits for it and
// both commit.
func TestAppendAndFoldOverANewStreamNeverDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schema := b.store.Schema()
	b.appendN(t, "dl-b", 1)
	require.NoError(t, store.Fold(b.ctx, b.store))
	b.appendN(t, "dl-b", 1) // a marker of a stream with a row: the fold locks it
	b.appendN(t, "dl-a", 1) // a marker of a new stream: the fold inserts its row
	require.Equal(t, 2, b.markers(t))
	listen(t, schema) // a drainer waits: appends lock the streams' rows

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	insert := "INSERT INTO " + schema + ".events (stream, version, name, data) VALUES ($1, $2, 'E', '{}')"
	_, err = tx.Exec(b.ctx, insert, "dl-a", 1)
	require.NoError(t, err)

	folded := make(chan error, 1)
	go func() { folded <- store.Fold(b.ctx, b.store) }()
	// Until the fold ends, or waits for a lock (the cycle's first half).
	var foldErr error
	ended := false
	require.Eventually(t, func() bool {
		select {
		case foldErr = <-folded:
			ended = true
			return true
		default:
		}
		var waiting int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%' || $1 || '.appended%'`, schema).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 5*time.Millisecond)

	_, err = tx.Exec(b.ctx, insert, "dl-b", 2)
	require.NoError(t, err, "the append's second stream")
	require.NoError(t, tx.Commit(b.ctx))
	if !ended {
		select {
		case foldErr = <-folded:
		case <-time.After(10 * time.Second):
			t.Fatal("the fold did not end after the append committed")
		}
	}
	require.NoError(t, foldErr, "the fold")

	require.EqualValues(t, 1, b.info(t, "dl-a").Head)
	require.EqualValues(t, 2, b.info(t, "dl-b").Head)
	require.Zero(t, b.markers(t))
}

// The folds vacuum the marker table themselves every so many markers
// (autovacuum visits it at most once per naptime): after a claim folds
// that many, the table is vacuumed.
func TestFoldsVacuumTheMarkerTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetMarkerVacuumEvery(b.store, 5)
	vacuums := func() int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'appended'`, b.store.Schema()).Scan(&n))
		return n
	}
	before := vacuums()
	b.appendN(t, "v-1", 4)
	_, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Zero(t, b.markers(t))
	require.Equal(t, before, vacuums(), "4 markers folded: no vacuum yet")

	b.appendN(t, "v-2", 1)
	_, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return vacuums() > before }, 10*time.Second, 10*time.Millisecond,
		"5 markers folded: the marker table vacuumed")
}

// While the folds read full (a backlog of markers) the marker table is
// not vacuumed, however many they folded: the first fold that reads less
// starts the vacuum.
func TestFoldsDeferTheMarkerVacuumThroughABacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store.SetMarkerVacuumEvery(b.store, 5)
	store.SetMarkerVacuumSQL(b.store, "SELECT pg_sleep(30)") // stays running once started
	t.Cleanup(b.store.Close)
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+`.events (stream, version, name, data)
SELECT 'bk-' || (g % 100), g / 100, 'E', '{}' FROM generate_series(0, 10004) g`)
	require.NoError(t, err)
	require.Equal(t, 10005, b.markers(t))

	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 5, b.markers(t), "one fold read its limit")
	require.False(t, store.MarkerVacuumRunning(b.store), "a full fold starts no vacuum")
	// Leased streams keep their markers from a claim's fold: let go.
	require.NoError(t, b.store.Release(b.ctx, "x", claimedNames(claims)))

	_, err = b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Zero(t, b.markers(t))
	require.True(t, store.MarkerVacuumRunning(b.store), "the fold after the backlog starts it")
}

// Close cancels the marker table's vacuum that runs and waits for it, so
// the caller can close the pool after it with no statement of the
// store's own left to run there; no vacuum starts after it, and a
// cancelled vacuum logs nothing.
func TestCloseEndsTheMarkerVacuum(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs bytes.Buffer
	s, err := store.New(b.pool, store.WithSchema(b.store.Schema()), store.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	store.SetMarkerVacuumEvery(s, 1)
	// A vacuum that waits for as long as the test holds this lock.
	holder, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(b.ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", s.Schema()+" vacuum")
	require.NoError(t, err)
	store.SetMarkerVacuumSQL(s, "SELECT pg_advisory_xact_lock(hashtextextended('"+s.Schema()+" vacuum', 0))")

	s.Close() // nothing runs: at once
	require.False(t, store.MarkerVacuumRunning(s))
	b.appendN(t, "c-1", 1)
	_, err = s.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.False(t, store.MarkerVacuumRunning(s), "closed: no vacuum started")

	s, err = store.New(b.pool, store.WithSchema(b.store.Schema()), store.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	store.SetMarkerVacuumEvery(s, 1)
	store.SetMarkerVacuumSQL(s, "SELECT pg_advisory_xact_lock(hashtextextended('"+s.Schema()+" vacuum', 0))")
	b.appendN(t, "c-2", 1)
	_, err = s.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.True(t, store.MarkerVacuumRunning(s), "one marker folded: a vacuum started")
	b.waitForLockWaiter(t, "the vacuum waits for the test's lock")

	s.Close()
	require.False(t, store.MarkerVacuumRunning(s))
	require.Eventually(t, func() bool { // the server ends the statement on its own time
		var waiting int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%pg_advisory_xact_lock%'`).Scan(&waiting))
		return waiting == 0
	}, 10*time.Second, 5*time.Millisecond, "the vacuum was cancelled")
	b.appendN(t, "c-3", 1)
	_, err = s.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.False(t, store.MarkerVacuumRunning(s), "closed: no vacuum started")
	s.Close() // again: a no-op
	require.Empty(t, logs.String(), "a vacuum cancelled by Close logs nothing")
}

// A claim's fold leaves the markers of a stream under a live lease: the
// claim made ahead of a cycle's settle, whose transaction holds the rows
// it folds until its fetch is done, then never makes that settle wait
// for it (the bridge's backlog drain timed out its acks so). The settle's
// stream is pending again once its owner settled it.
func TestClaimFoldLeavesALeasedStreamItsSettleNeverWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, store.WithSettleTimeout(300*time.Millisecond))
	ctx, pool, s := b.ctx, b.pool, b.store
	first := b.appendN(t, "lease-1", 1)
	claims, err := s.Claim(ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"lease-1"}, claimedNames(claims))
	b.appendN(t, "lease-1", 1) // a marker while x holds the stream
	b.appendN(t, "free-1", 1)

	ahead, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ahead.Rollback(ctx) }()
	read, kept, err := store.FoldIn(ctx, ahead, s, 100, true)
	require.NoError(t, err)
	require.Equal(t, int64(2), read)
	require.Equal(t, int64(1), kept, "lease-1's marker is left while x's lease lives")

	require.NoError(t, s.Ack(ctx, "x", "lease-1", first[0].Version, first[0].ID), "the settle does not wait for the open fold")
	require.NoError(t, ahead.Commit(ctx))

	claims, err = s.Claim(ctx, "y", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"free-1", "lease-1"}, sortedClaimNames(claims), "lease-1 pending again once x settled it")
	require.Zero(t, b.markers(t))

	// A reader's fold takes a leased stream's markers: it counts every
	// committed event.
	b.appendN(t, "lease-1", 1)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, kept, err = store.FoldIn(ctx, tx, s, 100, false)
	require.NoError(t, err)
	require.Zero(t, kept)
}

// A backlog of many markers a stream writes each row once: the fold sets
// the head to the stream's highest committed version, and the markers at
// or below it are deleted by later folds without the row being locked or
// written again (its tuple stays the same).
func TestFoldOfABacklogWritesEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Round robin, as a bulk insert of many streams lays its markers.
	for range 5 {
		for _, st := range []string{"bulk-1", "bulk-2", "bulk-3"} {
			b.appendN(t, st, 1)
		}
	}
	require.Equal(t, 15, b.markers(t))
	fold := func(limit int) (int64, int64) {
		t.Helper()
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		read, kept, err := store.FoldIn(b.ctx, tx, b.store, limit, true)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))
		return read, kept
	}
	tuples := func() map[string]string {
		t.Helper()
		rows, err := b.pool.Query(b.ctx, "SELECT stream, ctid::text || '/' || xmin::text || '/' || xmax::text FROM "+b.store.Schema()+".streams")
		require.NoError(t, err)
		out := map[string]string{}
		for rows.Next() {
			var st, tu string
			require.NoError(t, rows.Scan(&st, &tu))
			out[st] = tu
		}
		require.NoError(t, rows.Err())
		return out
	}
	read, kept := fold(3) // the first marker of each stream
	require.Equal(t, int64(3), read)
	require.Zero(t, kept)
	before := tuples()
	require.Len(t, before, 3)
	for _, st := range []string{"bulk-1", "bulk-2", "bulk-3"} {
		var head int64
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT head FROM "+b.store.Schema()+".streams WHERE stream = $1", st).Scan(&head))
		require.Equal(t, int64(4), head, "%s: the head is the highest committed version, not the marker's", st)
	}
	for b.markers(t) > 0 {
		read, kept = fold(3)
		require.Equal(t, int64(3), read)
		require.Zero(t, kept)
	}
	require.Equal(t, before, tuples(), "covered markers leave the rows untouched (no new version, no lock)")

	claims, err := b.store.Claim(b.ctx, "x", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"bulk-1", "bulk-2", "bulk-3"}, sortedClaimNames(claims))
	for _, c := range claims {
		require.Equal(t, int64(-1), c.Watermark)
	}
}

// sortedClaimNames is claimedNames sorted.
func sortedClaimNames(claims []event.Claim) []string {
	names := claimedNames(claims)
	slices.Sort(names)
	return names
}
