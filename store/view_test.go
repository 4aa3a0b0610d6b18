package store_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// renamedTable is an application's event log whose columns are named as
// many event stores name them, and renamedView maps it onto the common
// layout for the bridge (docs/events-table.md).
const (
	renamedTable = `CREATE TABLE %s.event_log (
    seq         bigserial   PRIMARY KEY,
    stream_id   text        NOT NULL,
    position    bigint      NOT NULL,
    type        text        NOT NULL,
    payload     jsonb       NOT NULL,
    metadata    jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream_id, position)
)`
	renamedView = `CREATE VIEW %s.events AS
SELECT seq AS id, stream_id AS stream, position AS version, type AS name,
       payload AS data, metadata AS meta, recorded_at AS created
FROM %s.event_log`
)

// viewBundle is an app schema holding the renamed log and the view, and a
// store draining the view.
type viewBundle struct {
	extBundle
	log string // the app's table, schema.event_log
}

func setupView(t *testing.T) viewBundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	ctx := t.Context()
	for _, ddl := range []string{renamedTable, renamedView} {
		_, err := pool.Exec(ctx, strings.ReplaceAll(ddl, "%s", app))
		require.NoError(t, err)
	}
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx), "the layout check accepts a view")
	return viewBundle{extBundle{ctx: ctx, pool: pool, store: s, appTable: app + ".events"}, app + ".event_log"}
}

// A view renaming stream_id, position, type, ... to the common layout is
// drained like a table: discovered, claimed and fetched in version order.
// Versions starting at 1 are forwarded as they are (1, 2, 3); the counts
// that assume 0-based versions (head + 1 events per stream) are one high
// per stream.
func TestViewRenamingColumnsIsDrained(t *testing.T) {
	t.Parallel()
	b := setupView(t)
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.log+` (stream_id, position, type, payload) VALUES
    ('order-1', 1, 'OrderPlaced', '{"n":1}'), ('order-1', 2, 'OrderPaid', '{"n":2}'),
    ('order-2', 1, 'OrderPlaced', '{"n":3}'), ('order-1', 3, 'OrderShipped', '{"n":4}')`)
	require.NoError(t, err)

	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"order-1": 3, "order-2": 1}, b.heads(t))

	claims, err := b.store.Claim(b.ctx, "a", 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"order-1", "order-2"}, claimedNames(claims))
	read, err := b.store.Fetch(b.ctx, claims, 10)
	require.NoError(t, err)
	var got []string
	for _, e := range read {
		got = append(got, e.Stream+"@"+strconv.FormatInt(e.Version, 10)+":"+e.Name+":"+string(e.Data))
	}
	require.ElementsMatch(t, []string{
		`order-1@1:OrderPlaced:{"n": 1}`, `order-1@2:OrderPaid:{"n": 2}`, `order-1@3:OrderShipped:{"n": 4}`,
		`order-2@1:OrderPlaced:{"n": 3}`,
	}, got, "the first event is version 1: nothing is renumbered")
	last := map[string]int{} // an ack settles the claim: the last event of each stream
	for i, e := range read {
		last[e.Stream] = i
	}
	for _, i := range last {
		require.NoError(t, b.store.Ack(b.ctx, "a", read[i].Stream, read[i].Version, read[i].ID))
	}
	infos, err := b.store.Streams(b.ctx, store.StreamFilter{})
	require.NoError(t, err)
	for _, i := range infos {
		require.Equal(t, i.Head, i.Watermark, "%s is caught up", i.Stream)
	}

	// 4 events, but the totals count head + 1 per stream (0-based).
	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, appended, "1-based versions count one event too many per stream")
	require.EqualValues(t, 6, forwarded)
}

// Discovery is exact on a table because it waits for the transactions
// holding a write lock on the table or its id sequence: an id drawn before
// one it read may still commit. Writers lock the application's table and
// its sequence, not the view, so for a view discovery watches the tables
// the view reads and their sequences: a lower id committed after a higher
// one was read, or drawn (nextval) before its row is inserted, is not
// missed. (Watching the view alone, the scan position passed slow-1's id
// while its writer was open and slow-1 was never discovered.)
func TestViewLateCommitOfALowerID(t *testing.T) {
	t.Parallel()
	b := setupView(t)
	slow, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(b.ctx) }()
	var slowID int64
	require.NoError(t, slow.QueryRow(b.ctx, "INSERT INTO "+b.log+" (stream_id, position, type, payload) VALUES ('slow-1', 1, 'E', '{}') RETURNING seq").Scan(&slowID))
	early, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = early.Rollback(b.ctx) }()
	var earlyID int64
	require.NoError(t, early.QueryRow(b.ctx, "SELECT nextval(pg_get_serial_sequence($1, 'seq'))", b.log).Scan(&earlyID))
	_, err = b.pool.Exec(b.ctx, "INSERT INTO "+b.log+" (stream_id, position, type, payload) VALUES ('fast-1', 1, 'E', '{}')")
	require.NoError(t, err)

	for range 3 {
		st, err := b.store.Discover(b.ctx)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"fast-1": 1}, b.heads(t))
		require.Less(t, st.Low, slowID, "the scan position stays below an id that may still commit")
	}
	require.NoError(t, slow.Commit(b.ctx))
	_, err = early.Exec(b.ctx, "INSERT INTO "+b.log+" (seq, stream_id, position, type, payload) VALUES ($1, 'early-1', 1, 'E', '{}')", earlyID)
	require.NoError(t, err)
	require.NoError(t, early.Commit(b.ctx))
	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"fast-1": 1, "slow-1": 1, "early-1": 1}, b.heads(t))
}

// End to end through a view with 1-based versions: the bridge publishes
// versions 1, 2, 3 as they are (ce-streamversion), and the consumer
// delivers them in order.
func TestViewOneBasedEndToEnd(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	for _, ddl := range []string{renamedTable, renamedView} {
		_, err := pool.Exec(t.Context(), strings.ReplaceAll(ddl, "%s", app))
		require.NoError(t, err)
	}
	k := jsbridgetest.Start(t, jsbridgetest.Config{Pool: pool, Bridge: bridge.Config{EventsTable: app + ".events", PollInterval: 50 * time.Millisecond}})
	var ids []string
	for v := int64(1); v <= 3; v++ {
		var id int64
		require.NoError(t, pool.QueryRow(t.Context(), "INSERT INTO "+app+".event_log (stream_id, position, type, payload) VALUES ('order-1', $1, 'OrderEvent', '{}') RETURNING seq", v).Scan(&id))
		ids = append(ids, strconv.FormatInt(id, 10))
	}
	ds := k.Receiver.RequireStream(t, "order-1", ids...)
	for i, d := range ds {
		require.EqualValues(t, i+1, d.Version, "delivered as stored: 1-based")
	}
	require.Len(t, k.Stored(t, ""), 3)
}
