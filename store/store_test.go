package store_test

import (
	"context"
	"encoding/json"
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

// The Postgres store is what cmd/bridge plugs into the drain.
var (
	_ drain.Store        = (*store.Store)(nil)
	_ drain.Notifier     = (*store.Store)(nil)
	_ drain.IdleNotifier = (*store.Store)(nil)
)

type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *store.Store
}

// setup makes a Store on a fresh schema of the test database, migrated,
// with opts after the schema.
func setup(t *testing.T, opts ...store.Option) bundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	s, err := store.New(pool, append([]store.Option{store.WithSchema(jsbridgetest.Schema(t, pool))}, opts...)...)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.Migrate(ctx))
	return bundle{ctx: ctx, pool: pool, store: s}
}

func ev(name string, data string) store.NewEvent {
	return store.NewEvent{Name: name, Data: []byte(data)}
}

// appendN appends n events to stream (any version) and returns them.
func (b bundle) appendN(t *testing.T, stream string, n int) []event.Event {
	t.Helper()
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = ev("Happened", fmt.Sprintf(`{"n":%d}`, i))
	}
	out, err := b.store.Append(b.ctx, stream, store.AnyVersion, evs...)
	require.NoError(t, err)
	return out
}

func (b bundle) info(t *testing.T, stream string) store.StreamInfo {
	t.Helper()
	infos, err := b.store.Streams(b.ctx, store.StreamFilter{Match: "^" + stream + "$"})
	require.NoError(t, err)
	require.Len(t, infos, 1, "stream %s", stream)
	return infos[0]
}

func claimedNames(claims []event.Claim) []string {
	var names []string
	for _, c := range claims {
		names = append(names, c.Stream)
	}
	return names
}

func TestWithSchemaRejectsNonIdentifier(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	for _, name := range []string{"", "Bad", "a-b", "x; DROP TABLE y", "1abc"} {
		_, err := store.New(pool, store.WithSchema(name))
		require.ErrorIs(t, err, store.ErrInvalidConfig, name)
		require.ErrorContains(t, err, fmt.Sprintf("%q", name))
	}
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var before []time.Time
	rows, err := b.pool.Query(b.ctx, "SELECT applied_at FROM "+b.store.Schema()+".jsbridge_migrations ORDER BY version")
	require.NoError(t, err)
	before, err = pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	require.NotEmpty(t, before)
	b.appendN(t, "order-1", 2)

	require.NoError(t, b.store.Migrate(b.ctx))

	rows, err = b.pool.Query(b.ctx, "SELECT applied_at FROM "+b.store.Schema()+".jsbridge_migrations ORDER BY version")
	require.NoError(t, err)
	after, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	require.Equal(t, before, after)
	require.Equal(t, int64(1), b.info(t, "order-1").Head, "data survives a second migrate")
	require.Len(t, b.store.MigrationSQL(), 2+2*len(before), "schema, migrations table, then each migration and its record")
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := store.New(pool, store.WithSchema(schema))
			if err == nil {
				err = s.Migrate(t.Context())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+".jsbridge_migrations").Scan(&n))
	s, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	require.Equal(t, (len(s.MigrationSQL())-2)/2, n, "each migration recorded once")
}

func TestAppendAndReadBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	meta := event.Meta{Correlation: "corr-1", Causation: "cause-1"}
	got, err := b.store.Append(b.ctx, "order-42", store.NoStream,
		store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total": 12}`), Meta: meta},
		ev("OrderConfirmed", `{}`))
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, int64(0), got[0].Version)
	require.Equal(t, int64(1), got[1].Version)
	require.Less(t, got[0].ID, got[1].ID)
	require.Equal(t, meta, got[0].Meta)
	require.Equal(t, "OrderPlaced", got[0].Name)
	require.JSONEq(t, `{"total": 12}`, string(got[0].Data))
	require.False(t, got[0].Created.IsZero())

	more, err := b.store.Append(b.ctx, "order-42", 1, ev("OrderShipped", `{"carrier":"x"}`))
	require.NoError(t, err)
	require.Equal(t, int64(2), more[0].Version)

	read, err := b.store.Fetch(b.ctx, []event.Claim{{Stream: "order-42", Watermark: -1}}, 10)
	require.NoError(t, err)
	require.Len(t, read, 3)
	for i, e := range append(got, more...) {
		require.Equal(t, e.ID, read[i].ID)
		require.Equal(t, e.Version, read[i].Version)
		require.Equal(t, e.Name, read[i].Name)
		require.Equal(t, e.Data, read[i].Data, "Append returns the data as stored")
		require.True(t, read[i].DataJSON, "the own table's data is jsonb")
		require.Equal(t, e.Meta, read[i].Meta)
		require.True(t, e.Created.Equal(read[i].Created))
	}

	si := b.info(t, "order-42")
	require.Equal(t, int64(2), si.Head)
	require.Equal(t, int64(-1), si.Watermark)
	require.Equal(t, int64(3), si.Lag)
}

func TestAppendRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		stream string
		events []store.NewEvent
		want   string
	}{
		{"", []store.NewEvent{ev("A", `{}`)}, "stream is empty"},
		{"s-1", nil, `no events to append to stream "s-1"`},
		{"s-1", []store.NewEvent{ev("A", `{}`), ev("", `{}`)}, `events[1].Name of stream "s-1" is empty`},
		{"s-1", []store.NewEvent{ev("A", `{nope`)}, `events[0].Data of stream "s-1" (A) is not valid JSON: "{nope"`},
	}
	for _, c := range cases {
		_, err := b.store.Append(b.ctx, c.stream, store.AnyVersion, c.events...)
		require.ErrorIs(t, err, store.ErrInvalidInput)
		require.ErrorContains(t, err, c.want)
	}
	_, err := b.store.Append(b.ctx, "s-1", -3, ev("A", `{}`))
	require.ErrorContains(t, err, "expectedVersion -3")
}

func TestAppendVersionMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "cart-1", 3)

	_, err := b.store.Append(b.ctx, "cart-1", 1, ev("Late", `{}`))
	var ce *store.ConcurrencyError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, store.ConcurrencyError{Stream: "cart-1", Expected: 1, Actual: 2}, *ce)

	_, err = b.store.Append(b.ctx, "cart-1", store.NoStream, ev("Late", `{}`))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(2), ce.Actual)

	_, err = b.store.Append(b.ctx, "cart-2", 0, ev("First", `{}`))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(-1), ce.Actual)
	require.Equal(t, int64(2), b.info(t, "cart-1").Head, "nothing appended on conflict")
}

func TestAppendUniqueViolationRaceIsConcurrencyError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "cart-7", 1)

	tx1, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.ctx) }()
	_, err = b.store.AppendTx(b.ctx, tx1, "cart-7", 0, ev("FromTx1", `{}`))
	require.NoError(t, err)

	tx2, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback(b.ctx) }()
	var tx2PID uint32
	require.NoError(t, tx2.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&tx2PID))
	done := make(chan error, 1)
	go func() {
		// Same expectation: passes the head check, then waits on the unique
		// index entry tx1 holds.
		_, err := b.store.AppendTx(b.ctx, tx2, "cart-7", 0, ev("FromTx2", `{}`))
		done <- err
	}()
	// Commit tx1 only once tx2 is waiting on tx1's lock.
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", tx2PID).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx1.Commit(b.ctx))

	err = <-done
	var ce *store.ConcurrencyError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, store.ConcurrencyError{Stream: "cart-7", Expected: 0, Actual: 1}, *ce)

	// The savepoint leaves tx2 usable.
	var one int
	require.NoError(t, tx2.QueryRow(b.ctx, "SELECT 1").Scan(&one))
	require.NoError(t, tx2.Commit(b.ctx))
	read, err := b.store.Fetch(b.ctx, []event.Claim{{Stream: "cart-7", Watermark: -1}}, 10)
	require.NoError(t, err)
	require.Len(t, read, 2)
	require.Equal(t, "FromTx1", read[1].Name)
}

func TestClaimExclusiveBetweenConcurrentClaimers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const streams = 200
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	for i := range streams {
		_, err := b.store.AppendTx(b.ctx, tx, fmt.Sprintf("s-%03d", i), store.NoStream, ev("E", `{}`))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(b.ctx))

	owners := []string{"bridge-a", "bridge-b"}
	got := make([][]string, len(owners))
	var wg sync.WaitGroup
	for i, owner := range owners {
		wg.Go(func() {
			for {
				claims, err := b.store.Claim(b.ctx, owner, 7, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if len(claims) == 0 {
					return
				}
				got[i] = append(got[i], claimedNames(claims)...)
			}
		})
	}
	wg.Wait()

	seen := map[string]string{}
	for i, names := range got {
		for _, n := range names {
			prev, dup := seen[n]
			require.False(t, dup, "stream %s claimed by %s and %s", n, prev, owners[i])
			seen[n] = owners[i]
		}
	}
	require.Len(t, seen, streams, "every pending stream claimed once")
}

func TestClaimReturnsWatermarkRetryAndLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "acct-1", 3)
	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, int64(-1), claims[0].Watermark)
	require.WithinDuration(t, time.Now().Add(time.Minute), claims[0].LeasedUntil, 10*time.Second)
	require.NoError(t, b.store.Retry(b.ctx, "a", "acct-1", evs[0].Version, evs[0].ID, 0, "boom"))

	claims, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, int64(0), claims[0].Watermark)
	require.Equal(t, 1, claims[0].Retry)

	// Held streams are not claimed again, even by their owner.
	again, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, again)

	require.NoError(t, b.store.Ack(b.ctx, "a", "acct-1", evs[2].Version, evs[2].ID))
	si := b.info(t, "acct-1")
	require.Equal(t, int64(2), si.Watermark)
	require.Equal(t, 0, si.Retry)
	require.Empty(t, si.Error)
	require.Empty(t, si.LeasedBy)
	none, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, none, "a stream at its head is not claimed")
}

func TestExpiredHolderIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "inv-1", 2)
	claims, err := b.store.Claim(b.ctx, "slow", 10, 20*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	time.Sleep(40 * time.Millisecond)

	err = b.store.Ack(b.ctx, "slow", "inv-1", evs[1].Version, evs[1].ID)
	require.ErrorIs(t, err, event.ErrLeaseLost)
	err = b.store.Retry(b.ctx, "slow", "inv-1", evs[1].Version, evs[1].ID, time.Hour, "x")
	require.ErrorIs(t, err, event.ErrLeaseLost)
	err = b.store.Block(b.ctx, "slow", "inv-1", evs[1].Version, evs[1].ID, "x")
	require.ErrorIs(t, err, event.ErrLeaseLost)
	err = b.store.Release(b.ctx, "slow", []string{"inv-1"})
	require.ErrorIs(t, err, event.ErrLeaseLost)
	err = b.store.Ack(b.ctx, "stranger", "inv-1", evs[1].Version, evs[1].ID)
	require.ErrorIs(t, err, event.ErrLeaseLost)

	si := b.info(t, "inv-1")
	require.Equal(t, int64(-1), si.Watermark)
	require.Equal(t, 0, si.Retry)
	require.False(t, si.Blocked)
	require.True(t, si.NextAttempt.IsZero())
	require.Equal(t, "slow", si.LeasedBy, "the expired lease is left for the next claim")
}

func TestExpiredLeaseIsTakenOverWithoutRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "ship-1", 2)
	// One failed attempt first, so the count has something to keep.
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Retry(b.ctx, "a", "ship-1", -1, 0, 0, "flaky"))

	// The lease runs on Postgres' clock, so it cannot be injected: it is
	// long enough that the next claim comes inside it even on a loaded
	// machine, and the check holds only when the claim did come inside it
	// (timed from before the lease was taken, so never too generously).
	const lease = time.Second
	claimed := time.Now()
	claims, err := b.store.Claim(b.ctx, "a", 10, lease)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, 1, claims[0].Retry)
	require.Empty(t, claims[0].PreviousHolder, "the retry released the lease: no takeover")
	none, err := b.store.Claim(b.ctx, "b", 10, time.Minute)
	require.NoError(t, err)
	if time.Since(claimed) < lease {
		require.Empty(t, none, "a live lease is not taken over")
	} else {
		t.Logf("the second claim came %v after the first (lease %v): the live-lease check is moot this run", time.Since(claimed), lease)
	}

	taken := none // the takeover, when the check above was moot
	require.Eventually(t, func() bool {
		if len(taken) == 0 {
			taken, err = b.store.Claim(b.ctx, "b", 10, time.Minute)
			require.NoError(t, err)
		}
		return len(taken) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "ship-1", taken[0].Stream)
	require.Equal(t, 1, taken[0].Retry, "a takeover does not count a retry")
	require.Equal(t, "a", taken[0].PreviousHolder, "a takeover names the expired holder")
	require.Equal(t, int64(-1), taken[0].Watermark)

	require.ErrorIs(t, b.store.Ack(b.ctx, "a", "ship-1", evs[1].Version, evs[1].ID), event.ErrLeaseLost)
	require.NoError(t, b.store.Ack(b.ctx, "b", "ship-1", evs[1].Version, evs[1].ID))
	require.Equal(t, int64(1), b.info(t, "ship-1").Watermark)
}

func TestBlockedStreamIsNotClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "bad-1", 3)
	b.appendN(t, "good-1", 1)
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Block(b.ctx, "a", "bad-1", evs[0].Version, evs[0].ID, "event 2: poison"))
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"good-1"}))

	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"good-1"}, claimedNames(claims))
	si := b.info(t, "bad-1")
	require.True(t, si.Blocked)
	require.Equal(t, "event 2: poison", si.Error)
	require.Equal(t, int64(0), si.Watermark, "block keeps the partial progress")

	changed, err := b.store.Unblock(b.ctx, []string{"bad-1", "good-1", "missing"})
	require.NoError(t, err)
	require.Len(t, changed, 1)
	require.Equal(t, "bad-1", changed[0].Stream)
	require.True(t, changed[0].Blocked, "reports the stream as it was")
	require.NotEmpty(t, changed[0].Error)
	claims, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, "bad-1", claims[0].Stream)
	require.Equal(t, int64(0), claims[0].Watermark, "unblock resumes from the watermark")
	require.Equal(t, 0, claims[0].Retry)
}

func TestNextAttemptInFutureIsNotClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "later-1", 1)
	b.appendN(t, "now-1", 1)
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Retry(b.ctx, "a", "later-1", -1, 0, time.Hour, "receiver down"))
	require.NoError(t, b.store.Retry(b.ctx, "a", "now-1", -1, 0, 0, "receiver down"))

	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"now-1"}, claimedNames(claims))
	si := b.info(t, "later-1")
	require.WithinDuration(t, time.Now().Add(time.Hour), si.NextAttempt, 10*time.Second)
	require.Equal(t, 1, si.Retry)
	require.Equal(t, "receiver down", si.Error)
	require.Equal(t, int64(-1), si.Watermark)
}

func TestPostponeKeepsRetryAndMakesTheNextClaimReconcile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "out-1", 3)
	// One failure of the stream first: an outage must keep that count as is.
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Retry(b.ctx, "a", "out-1", -1, 0, 0, "refused"))

	for i := range 3 {
		claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claims, 1, "attempt %d", i)
		require.Equal(t, 1, claims[0].Retry, "attempt %d: outages count no retry", i)
		if i > 0 {
			require.Equal(t, "a", claims[0].PreviousHolder, "attempt %d: the postponed attempt's holder is named, so the drain reconciles", i)
		}
		require.NoError(t, b.store.Postpone(b.ctx, "a", "out-1", evs[i].Version, evs[i].ID, 0, "bus unavailable"))
		require.ErrorIs(t, b.store.Ack(b.ctx, "a", "out-1", evs[2].Version, evs[2].ID), event.ErrLeaseLost,
			"the postponed lease is over")
	}
	si := b.info(t, "out-1")
	require.Equal(t, 1, si.Retry)
	require.Equal(t, int64(2), si.Watermark, "partial progress is kept")
	require.Equal(t, "bus unavailable", si.Error)
	require.False(t, si.Blocked)

	// The delay holds the stream back like Retry's.
	evs = append(evs, b.appendN(t, "out-1", 1)...)
	claims, err := b.store.Claim(b.ctx, "b", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, "a", claims[0].PreviousHolder)
	require.NoError(t, b.store.Postpone(b.ctx, "b", "out-1", claims[0].Watermark, 0, time.Hour, "bus unavailable"))
	none, err := b.store.Claim(b.ctx, "b", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, none)
	require.WithinDuration(t, time.Now().Add(time.Hour), b.info(t, "out-1").NextAttempt, 10*time.Second)
	require.ErrorIs(t, b.store.Postpone(b.ctx, "b", "out-1", evs[3].Version, evs[3].ID, 0, "x"), event.ErrLeaseLost,
		"fenced by the lease like every settle")
}

func TestRetryAndBlockNeverMoveWatermarkBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "w-1", 4)
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Ack(b.ctx, "a", "w-1", evs[2].Version, evs[2].ID))
	_, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Retry(b.ctx, "a", "w-1", evs[0].Version, evs[0].ID, 0, "x"))
	require.Equal(t, int64(2), b.info(t, "w-1").Watermark)
	_, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Block(b.ctx, "a", "w-1", -1, 0, "y"))
	si := b.info(t, "w-1")
	require.Equal(t, int64(2), si.Watermark)
	require.Equal(t, 2, si.Retry)
	var wid int64
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT watermark_id FROM "+b.store.Schema()+".streams WHERE stream = 'w-1'").Scan(&wid))
	require.Equal(t, evs[2].ID, wid)
}

// Once the drainer is idle, an append notifies; the channel is closed when
// ctx ends.
func TestNotificationsFireAfterAppend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	notes, err := b.store.Notifications(ctx)
	require.NoError(t, err)
	select {
	case <-notes:
		t.Fatal("notification before any append")
	default:
	}

	// A drainer idle (migration 006: appends notify only then).
	ready, err := b.store.Idle(b.ctx, notes)
	require.NoError(t, err)
	require.False(t, ready, "the idle lock taken: claim once more")
	b.appendN(t, "n-1", 1)
	select {
	case _, ok := <-notes:
		require.True(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after append")
	}

	cancel()
	require.Eventually(t, func() bool {
		select {
		case _, ok := <-notes:
			return !ok
		default:
			return false
		}
	}, 5*time.Second, 5*time.Millisecond, "channel closed when ctx ends")
}

// Ids are handed out at insert but become visible at commit, so a later id
// can commit first. The head in the streams row moves with the commit, so the
// stream holding the earlier id is still discovered.
func TestDiscoveryDoesNotSkipOutOfOrderCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx1, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.ctx) }()
	early, err := b.store.AppendTx(b.ctx, tx1, "slow-1", store.NoStream, ev("E", `{}`))
	require.NoError(t, err)
	late := b.appendN(t, "fast-1", 1)
	require.Greater(t, late[0].ID, early[0].ID)

	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"fast-1"}, claimedNames(claims))
	read, err := b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	require.Len(t, read, 1)
	require.NoError(t, b.store.Ack(b.ctx, "a", "fast-1", read[0].Version, read[0].ID))

	require.NoError(t, tx1.Commit(b.ctx))
	claims, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"slow-1"}, claimedNames(claims))
	read, err = b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	require.Len(t, read, 1)
	require.Equal(t, early[0].ID, read[0].ID)
}

func TestFetchGroupsByClaimAndLimitsPerStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.appendN(t, "a-1", 5)
	c := b.appendN(t, "c-1", 2)
	read, err := b.store.Fetch(b.ctx, []event.Claim{
		{Stream: "c-1", Watermark: -1},
		{Stream: "empty-1", Watermark: -1},
		{Stream: "a-1", Watermark: 1},
	}, 2)
	require.NoError(t, err)
	var got []int64
	for _, e := range read {
		got = append(got, e.ID)
	}
	require.Equal(t, []int64{c[0].ID, c[1].ID, a[2].ID, a[3].ID}, got)
	_, err = b.store.Fetch(b.ctx, nil, 0)
	require.ErrorIs(t, err, store.ErrInvalidInput)
}

func TestReleaseLetsAnotherOwnerClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "r-1", 1)
	b.appendN(t, "r-2", 1)
	claims, err := b.store.Claim(b.ctx, "a", 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"r-1", "r-2"}))
	claims, err = b.store.Claim(b.ctx, "b", 10, time.Hour)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"r-1", "r-2"}, claimedNames(claims))
	for _, c := range claims {
		require.Equal(t, 0, c.Retry)
	}
}

func TestEndLeasesKeepsTheStreamsInFlightAndOthersLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, st := range []string{"e-1", "e-2", "e-3"} {
		b.appendN(t, st, 1)
	}
	claims, err := b.store.Claim(b.ctx, "a", 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, claims, 3)
	b.appendN(t, "other-1", 1)
	_, err = b.store.Claim(b.ctx, "b", 10, time.Hour)
	require.NoError(t, err)

	// An application's transaction holds e-3's row: skipped, not waited for.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, "SELECT 1 FROM "+b.store.Schema()+".streams WHERE stream = 'e-3' FOR UPDATE")
	require.NoError(t, err)
	ended, busy, err := b.store.EndLeases(b.ctx, "a", []string{"e-2"})
	require.NoError(t, err)
	require.Equal(t, []string{"e-1"}, ended)
	require.Equal(t, []string{"e-3"}, busy, "a locked row is reported busy")
	require.NoError(t, tx.Rollback(b.ctx))
	ended, busy, err = b.store.EndLeases(b.ctx, "a", []string{"e-2"})
	require.NoError(t, err)
	require.Equal(t, []string{"e-3"}, ended, "every lease of a's but the one kept")
	require.Empty(t, busy)

	claims, err = b.store.Claim(b.ctx, "c", 10, time.Hour)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"e-1", "e-3"}, claimedNames(claims), "ended leases are claimable at once; e-2 (kept) and b's are not")
	for _, c := range claims {
		require.Equal(t, "a", c.PreviousHolder, "the next claim reconciles")
		require.Zero(t, c.Retry)
	}
	ended, _, err = b.store.EndLeases(b.ctx, "a", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"e-2"}, ended)
	_, _, err = b.store.EndLeases(b.ctx, "", nil)
	require.ErrorIs(t, err, store.ErrInvalidInput)
}

func TestStreamsFiltersResetAndTotals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := b.appendN(t, "order-1", 3)
	b.appendN(t, "order-2", 1)
	b.appendN(t, "payment-1", 2)
	_, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Ack(b.ctx, "a", "order-1", o[2].Version, o[2].ID))
	require.NoError(t, b.store.Block(b.ctx, "a", "payment-1", -1, 0, "poison"))
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"order-2"}))

	all, err := b.store.Streams(b.ctx, store.StreamFilter{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, "order-1", all[0].Stream)
	require.Equal(t, int64(0), all[0].Lag)
	require.Zero(t, all[0].LagAge)
	require.Equal(t, int64(1), all[1].Lag)
	require.Positive(t, all[1].LagAge)

	lagging, err := b.store.Streams(b.ctx, store.StreamFilter{Lagging: true, Match: "^order-"})
	require.NoError(t, err)
	require.Len(t, lagging, 1)
	require.Equal(t, "order-2", lagging[0].Stream)
	blocked, err := b.store.Streams(b.ctx, store.StreamFilter{Blocked: true})
	require.NoError(t, err)
	require.Len(t, blocked, 1)
	require.Equal(t, "payment-1", blocked[0].Stream)
	require.Equal(t, "poison", blocked[0].Error)
	named, err := b.store.Streams(b.ctx, store.StreamFilter{Names: []string{"payment-1", "order-2", "nope"}})
	require.NoError(t, err)
	require.Equal(t, []string{"order-2", "payment-1"}, []string{named[0].Stream, named[1].Stream})
	require.Len(t, named, 2)
	limited, err := b.store.Streams(b.ctx, store.StreamFilter{Limit: 2})
	require.NoError(t, err)
	require.Len(t, limited, 2)

	_, err = b.store.Streams(b.ctx, store.StreamFilter{Match: "(["})
	require.ErrorIs(t, err, store.ErrInvalidInput)
	require.ErrorContains(t, err, `Match "(["`)
	_, err = b.store.Streams(b.ctx, store.StreamFilter{Limit: -1})
	require.ErrorContains(t, err, "Limit -1")

	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), appended)
	require.Equal(t, int64(3), forwarded)

	reset, err := b.store.Reset(b.ctx, []string{"payment-1", "order-1", "nope"})
	require.NoError(t, err)
	require.Len(t, reset, 2)
	require.Equal(t, store.Changed{Stream: "order-1", Watermark: 2, Head: 2}, reset[0])
	require.Equal(t, store.Changed{Stream: "payment-1", Watermark: -1, Head: 1, Blocked: true, Error: "poison"}, reset[1])
	_, forwarded, err = b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), forwarded)
	si := b.info(t, "payment-1")
	require.False(t, si.Blocked)
	require.Equal(t, int64(-1), si.Watermark)
}

func TestMigrationSQLCreatesTheSchema(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	for _, q := range s.MigrationSQL() {
		_, err := pool.Exec(t.Context(), q)
		require.NoError(t, err)
	}
	_, err = s.Append(t.Context(), "x-1", store.NoStream, ev("E", `{"a":1}`))
	require.NoError(t, err)
	raw, err := json.Marshal(s.MigrationSQL())
	require.NoError(t, err)
	require.NotContains(t, string(raw), "{schema}")
}
