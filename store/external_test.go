package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// appTable is an events table of the common layout as another program
// creates it: a bigserial id (so it may also draw ids itself), no trigger.
const appTable = `CREATE TABLE %s.events (
    id      bigserial   PRIMARY KEY,
    stream  text        NOT NULL,
    version bigint      NOT NULL,
    name    text        NOT NULL,
    data    jsonb       NOT NULL,
    meta    jsonb,
    created timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, version)
)`

type extBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	store    *store.Store
	appTable string
}

func setupExternal(t *testing.T) extBundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	ctx := t.Context()
	_, err := pool.Exec(ctx, strings.ReplaceAll(appTable, "%s", app))
	require.NoError(t, err)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	return extBundle{ctx: ctx, pool: pool, store: s, appTable: app + ".events"}
}

// insert is the other program appending one event in tx (or on its own).
func (b extBundle) insert(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, stream string, version int64) int64 {
	t.Helper()
	var id int64
	require.NoError(t, q.QueryRow(b.ctx, "INSERT INTO "+b.appTable+" (stream, version, name, data) VALUES ($1, $2, 'Happened', '{}') RETURNING id", stream, version).Scan(&id))
	return id
}

func (b extBundle) heads(t *testing.T) map[string]int64 {
	t.Helper()
	infos, err := b.store.Streams(b.ctx, store.StreamFilter{})
	require.NoError(t, err)
	out := map[string]int64{}
	for _, i := range infos {
		out[i.Stream] = i.Head
	}
	return out
}

// Ids are drawn at insert and become visible at commit: a lower id can
// commit after a higher one was read, or be rolled back (a gap), and an id
// can be drawn (nextval) long before its row is inserted. Discovery misses
// none of them and never stops at a gap.
func TestDiscoverOutOfOrderCommitsAndRollbacks(t *testing.T) {
	t.Parallel()
	b := setupExternal(t)

	slow, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(b.ctx) }()
	slowID := b.insert(t, slow, "slow-1", 0)

	rolled, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	b.insert(t, rolled, "rolled-1", 0)
	require.NoError(t, rolled.Rollback(b.ctx))

	// A writer that drew an id and has not inserted its row yet.
	early, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = early.Rollback(b.ctx) }()
	var earlyID int64
	require.NoError(t, early.QueryRow(b.ctx, "SELECT nextval(pg_get_serial_sequence($1, 'id'))", b.appTable).Scan(&earlyID))

	fastID := b.insert(t, b.pool, "fast-1", 0)
	require.Greater(t, fastID, earlyID)
	require.Greater(t, earlyID, slowID)

	st, err := b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"fast-1": 0}, b.heads(t))
	require.Less(t, st.Low, slowID, "the scan position must stay below an id that may still commit")
	require.Equal(t, fastID, st.Seen)

	// Nothing changes while the writers are open, however often we look.
	for range 3 {
		st, err = b.store.Discover(b.ctx)
		require.NoError(t, err)
		require.Less(t, st.Low, slowID)
	}

	require.NoError(t, slow.Commit(b.ctx))
	_, err = early.Exec(b.ctx, "INSERT INTO "+b.appTable+" (id, stream, version, name, data) VALUES ($1, 'early-1', 0, 'Happened', '{}')", earlyID)
	require.NoError(t, err)
	require.NoError(t, early.Commit(b.ctx))

	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"fast-1": 0, "slow-1": 0, "early-1": 0}, b.heads(t))

	// Once no writer is open, the position passes every id read: idle
	// discovery reads nothing.
	require.Eventually(t, func() bool {
		st, err = b.store.Discover(b.ctx)
		return err == nil && st.Low == fastID
	}, 10*time.Second, 20*time.Millisecond)
	st, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Rows)

	// The drain reads the external table.
	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"fast-1", "slow-1", "early-1"}, claimedNames(claims))
	read, err := b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	require.Len(t, read, 3)
	require.Equal(t, event.Meta{}, read[0].Meta, "NULL meta reads as empty")
	require.False(t, read[0].DataJSON, "an external table's data may be text: the forwarder checks it")
}

func TestDiscoverCatchesUpInBoundedStepsAndMovesHeadsOnly(t *testing.T) {
	t.Parallel()
	b := setupExternal(t)
	// 25,000 existing events over 250 streams: more than one step.
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.appTable+` (stream, version, name, data)
SELECT 'order-' || (g % 250), g / 250, 'Happened', '{}' FROM generate_series(0, 24999) g ORDER BY g`)
	require.NoError(t, err)
	st, err := b.store.Discover(b.ctx)
	require.NoError(t, err)
	// Each step re-reads at most the previous step's ids (whose writers it
	// had to wait for): every row read, none more than twice.
	require.GreaterOrEqual(t, st.Rows, int64(25000))
	require.LessOrEqual(t, st.Rows, int64(2*25000))
	require.GreaterOrEqual(t, st.Streams, int64(250))
	heads := b.heads(t)
	require.Len(t, heads, 250)
	for s, h := range heads {
		require.EqualValues(t, 99, h, s)
	}
	appended, _, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 25000, appended)

	// A re-read moves nothing.
	st, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Streams)
}

func TestNotificationsPollAnExternalTable(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	_, err := pool.Exec(t.Context(), strings.ReplaceAll(appTable, "%s", app))
	require.NoError(t, err)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"),
		store.WithDiscoveryInterval(20*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	notes, err := s.Notifications(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), "INSERT INTO "+app+".events (stream, version, name, data) VALUES ('n-1', 0, 'E', '{}')")
	require.NoError(t, err)
	select {
	case <-notes:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after an insert into the external table")
	}
	claims, err := s.Claim(t.Context(), "a", 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"n-1"}, claimedNames(claims))
}

func TestMigrateLeavesTheExternalTableUntouched(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	_, err := pool.Exec(t.Context(), strings.ReplaceAll(appTable, "%s", app))
	require.NoError(t, err)
	before := jsbridgetest.SchemaShape(t, pool, app)
	bridge := jsbridgetest.Schema(t, pool)
	s, err := store.New(pool, store.WithSchema(bridge), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	require.NoError(t, s.Migrate(t.Context()), "idempotent")
	require.Equal(t, before, jsbridgetest.SchemaShape(t, pool, app))
	require.NotContains(t, jsbridgetest.SchemaShape(t, pool, bridge), "events:", "no events table of ours")

	stmts, err := store.MigrationSQL(store.WithSchema(bridge), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	all := strings.Join(stmts, "\n")
	require.NotContains(t, all, "TRIGGER")
	require.NotContains(t, all, app)
	require.Contains(t, all, bridge+".streams")
}

func TestWithEventsTableRejectsBadNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "events", ".events", "app.", "a.b.c"} {
		_, err := store.MigrationSQL(store.WithEventsTable(name))
		require.ErrorIs(t, err, store.ErrInvalidConfig, name)
		require.ErrorContains(t, err, `"`+name+`"`)
	}
	_, err := store.MigrationSQL(store.WithDiscoveryInterval(0))
	require.ErrorContains(t, err, "WithDiscoveryInterval 0s")
	_, err = store.MigrationSQL(store.WithSettleTimeout(-time.Second))
	require.ErrorContains(t, err, "WithSettleTimeout -1s")
}

func TestDiscoverOnOwnTableIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.store.Discover(b.ctx)
	require.ErrorIs(t, err, store.ErrNotExternal)
}

// An application transaction that appended while a drainer waited holds
// its stream's row until it commits; a settle of that stream gives up
// after the settle timeout instead of stalling the drain cycle.
func TestSettleGivesUpOnARowHeldByTheApp(t *testing.T) {
	t.Parallel()
	b := setup(t, store.WithSettleTimeout(300*time.Millisecond))
	ctx, pool, s := b.ctx, b.pool, b.store
	listen(t, s.Schema()) // a drainer waits: appends lock the stream's row
	evs, err := s.Append(ctx, "held-1", store.NoStream, ev("E", `{}`))
	require.NoError(t, err)
	_, err = s.Claim(ctx, "a", 10, time.Minute)
	require.NoError(t, err)

	app, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = app.Rollback(ctx) }()
	_, err = s.AppendTx(ctx, app, "held-1", 0, ev("E", `{}`))
	require.NoError(t, err)

	err = s.Ack(ctx, "a", "held-1", evs[0].Version, evs[0].ID)
	require.ErrorIs(t, err, store.ErrSettleTimeout)
	require.False(t, errors.Is(err, event.ErrLeaseLost))

	require.NoError(t, app.Commit(ctx))
	require.NoError(t, s.Ack(ctx, "a", "held-1", evs[0].Version, evs[0].ID), "the lease still holds: the ack goes through once the app commits")
}

func TestUnblockMatchAndBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bl, err := b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.Equal(t, store.Backlog{}, bl, "starts at zero")

	b.appendN(t, "order-1", 2)
	b.appendN(t, "order-2", 1)
	b.appendN(t, "payment-1", 1)
	_, err = b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.Block(b.ctx, "a", "order-1", -1, 0, "poison"))
	require.NoError(t, b.store.Block(b.ctx, "a", "payment-1", -1, 0, "poison"))
	require.NoError(t, b.store.Release(b.ctx, "a", []string{"order-2"}))

	bl, err = b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, bl.Blocked)
	require.EqualValues(t, 1, bl.Lagging)
	require.Positive(t, bl.OldestAge)

	_, err = b.store.UnblockMatch(b.ctx, "([")
	require.ErrorIs(t, err, store.ErrInvalidInput)
	changed, err := b.store.UnblockMatch(b.ctx, "^order-")
	require.NoError(t, err)
	require.Equal(t, []store.Changed{{Stream: "order-1", Watermark: -1, Head: 1, Blocked: true, Error: "poison"}}, changed)
	changed, err = b.store.UnblockMatch(b.ctx, "")
	require.NoError(t, err)
	require.Len(t, changed, 1)
	require.Equal(t, "payment-1", changed[0].Stream)
	bl, err = b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.Zero(t, bl.Blocked)
	require.EqualValues(t, 3, bl.Lagging)
}
