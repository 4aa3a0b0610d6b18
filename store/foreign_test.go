package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// foreignStore creates, in a schema of its own, an app's events table with
// the given column types for data and meta, and a migrated store draining
// it.
func foreignStore(t *testing.T, dataType, metaType string) (extBundle, error) {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE `+app+`.events (
    id      bigserial   PRIMARY KEY,
    stream  varchar(200) NOT NULL,
    version integer     NOT NULL,
    name    text        NOT NULL,
    data    `+dataType+`,
    meta    `+metaType+`,
    created timestamptz NOT NULL DEFAULT now(),
    extra   bytea,
    UNIQUE (stream, version)
)`)
	require.NoError(t, err)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	return extBundle{ctx: ctx, pool: pool, store: s, appTable: app + ".events"}, s.Migrate(ctx)
}

func (b extBundle) insertRow(t *testing.T, stream string, version int, data, meta any) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(b.ctx, "INSERT INTO "+b.appTable+" (stream, version, name, data, meta) VALUES ($1, $2, 'Happened', $3, $4) RETURNING id",
		stream, version, data, meta).Scan(&id))
	return id
}

// fetchAll discovers, claims every stream and fetches its events.
func (b extBundle) fetchAll(t *testing.T) map[int64]event.Event {
	t.Helper()
	_, err := b.store.Discover(b.ctx)
	require.NoError(t, err)
	claims, err := b.store.Claim(b.ctx, "a", 1000, time.Minute)
	require.NoError(t, err)
	evs, err := b.store.Fetch(b.ctx, claims, 100)
	require.NoError(t, err, "the content of a row must never fail the fetch")
	out := map[int64]event.Event{}
	for _, e := range evs {
		out[e.ID] = e
	}
	return out
}

// Meta of any JSON shape is read, from jsonb, json and text columns alike;
// data comes back byte for byte as the column prints it. A row the bridge
// cannot forward (NULL data, meta that is not JSON) comes back with Err
// naming the column, and the other rows are read as usual.
func TestFetchReadsAnyMetaAndFlagsUnreadableRows(t *testing.T) {
	t.Parallel()
	for _, types := range [][2]string{{"jsonb", "jsonb"}, {"json", "json"}, {"text", "text"}} {
		t.Run(types[0], func(t *testing.T) {
			t.Parallel()
			b, err := foreignStore(t, types[0], types[1])
			require.NoError(t, err)
			obj := b.insertRow(t, "a-1", 0, `{"n": 1}`, `{"correlation": 7, "causation": {"id": "e-1", "at": [1, 2]}, "tenant": {"deep": {"x": null}}}`)
			arr := b.insertRow(t, "a-1", 1, `[1, 2]`, `["correlation", "c"]`)
			str := b.insertRow(t, "b-1", 0, `"s"`, `"c-0"`)
			null := b.insertRow(t, "c-1", 0, `{}`, nil)
			strs := b.insertRow(t, "d-1", 0, `{}`, `{"correlation": "c-0", "causation": "e-9"}`)
			evs := b.fetchAll(t)
			require.Len(t, evs, 5)
			for _, e := range evs {
				require.NoError(t, e.Err, "event %d", e.ID)
			}
			causation := `{"id":"e-1","at":[1,2]}`
			if types[1] == "jsonb" {
				causation = `{"at":[1,2],"id":"e-1"}` // jsonb keeps keys in its own order
			}
			require.Equal(t, event.Meta{Correlation: "7", Causation: causation}, evs[obj].Meta)
			require.Equal(t, event.Meta{}, evs[arr].Meta)
			require.Equal(t, event.Meta{}, evs[str].Meta)
			require.Equal(t, event.Meta{}, evs[null].Meta)
			require.Equal(t, event.Meta{Correlation: "c-0", Causation: "e-9"}, evs[strs].Meta)
			require.Equal(t, `{"n": 1}`, string(evs[obj].Data))
			require.Equal(t, `[1, 2]`, string(evs[arr].Data))
		})
	}

	t.Run("unreadable", func(t *testing.T) {
		t.Parallel()
		b, err := foreignStore(t, "text", "text")
		require.NoError(t, err)
		before := b.insertRow(t, "x-1", 0, `{}`, `{}`)
		badMeta := b.insertRow(t, "x-1", 1, `{}`, `{"correlation": "c-0", "causation": }`)
		after := b.insertRow(t, "x-1", 2, `{}`, `{}`)
		nullData := b.insertRow(t, "y-1", 0, nil, `{}`)
		emptyMeta := b.insertRow(t, "z-1", 0, `{}`, ``)
		badData := b.insertRow(t, "z-1", 1, `not json`, `{}`)
		evs := b.fetchAll(t)
		require.Len(t, evs, 6)

		var ce *event.ColumnError
		require.True(t, errors.As(evs[badMeta].Err, &ce), "%v", evs[badMeta].Err)
		require.Equal(t, "meta", ce.Column)
		require.Equal(t, b.appTable, ce.Table)
		require.ErrorContains(t, ce, "column meta of "+b.appTable+": not valid JSON")
		require.True(t, errors.As(evs[nullData].Err, &ce))
		require.Equal(t, "data", ce.Column)
		require.ErrorContains(t, ce, "is NULL")
		for _, id := range []int64{before, after, emptyMeta, badData} {
			require.NoError(t, evs[id].Err, "event %d", id)
		}
		// Data that is not JSON is the forwarder's to refuse (it names the
		// event and "data" too); empty meta is no meta.
		require.Equal(t, "not json", string(evs[badData].Data))
		require.Equal(t, event.Meta{}, evs[emptyMeta].Meta)
	})
}

// The layout is checked when migrating: a column the bridge cannot read, a
// missing one or a missing table is named, and nothing is created.
func TestMigrateChecksTheExternalTableLayout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ data, meta, want string }{
		{"bytea", "jsonb", "column data is bytea (want jsonb, json or text)"},
		{"jsonb", "xml", "column meta is xml (want jsonb, json or text)"},
		{"integer", "jsonb", "column data is integer"},
	} {
		b, err := foreignStore(t, c.data, c.meta)
		require.ErrorIs(t, err, store.ErrEventsTableLayout)
		require.ErrorContains(t, err, "events table "+b.appTable+": "+c.want)
		require.NotContains(t, jsbridgetest.SchemaShape(t, b.pool, b.store.Schema()), "streams", "nothing created")
	}

	pool := jsbridgetest.Pool(t)
	app := jsbridgetest.Schema(t, pool)
	_, err := pool.Exec(t.Context(), `CREATE DOMAIN `+app+`.payload AS jsonb;
CREATE TABLE `+app+`.events (id bigint, stream text, version bigint, name text, data `+app+`.payload, created date)`)
	require.NoError(t, err)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"))
	require.NoError(t, err)
	err = s.Migrate(t.Context())
	require.ErrorIs(t, err, store.ErrEventsTableLayout)
	require.ErrorContains(t, err, "no column meta (want jsonb, json or text); column created is date (want timestamptz or timestamp)")
	require.NotContains(t, err.Error(), "column data", "a domain over jsonb is jsonb")

	s, err = store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".missing"))
	require.NoError(t, err)
	err = s.Migrate(t.Context())
	require.ErrorIs(t, err, store.ErrEventsTableMissing, "a missing table may yet be created: not a layout error")
	require.NotErrorIs(t, err, store.ErrEventsTableLayout)
	require.ErrorContains(t, err, app+".missing")
}

// The id column's sequence must keep CACHE 1, whether it is a serial's,
// an identity's or one a DEFAULT nextval names; a cached one is refused
// naming the sequence, its cache and the statement that fixes it, and
// nothing is created. Ids without a sequence are not checked.
func TestMigrateChecksTheIDSequenceCache(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	const columns = `, stream text, version bigint, name text, data jsonb, meta jsonb, created timestamptz)`
	for _, c := range []struct{ name, ddl, alter, seq string }{
		{"serial", `CREATE TABLE {app}.events (id bigserial` + columns, `ALTER SEQUENCE {app}.events_id_seq CACHE 20`, "{app}.events_id_seq"},
		{"identity", `CREATE TABLE {app}.events (id bigint GENERATED ALWAYS AS IDENTITY` + columns, `ALTER TABLE {app}.events ALTER COLUMN id SET CACHE 20`, "{app}.events_id_seq"},
		{"default", `CREATE SEQUENCE {app}.ids; CREATE TABLE {app}.events (id bigint DEFAULT nextval('{app}.ids')` + columns, `ALTER SEQUENCE {app}.ids CACHE 20`, "{app}.ids"},
		{"no sequence", `CREATE TABLE {app}.events (id bigint` + columns, ``, ""},
	} {
		app := jsbridgetest.Schema(t, pool)
		sql := func(s string) string { return strings.ReplaceAll(s, "{app}", app) }
		_, err := pool.Exec(t.Context(), sql(c.ddl))
		require.NoError(t, err, c.name)
		migrate := func() (*store.Store, error) {
			s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(app+".events"))
			require.NoError(t, err)
			return s, s.Migrate(t.Context())
		}
		_, err = migrate()
		require.NoError(t, err, "%s: CACHE 1, the default, is accepted", c.name)
		if c.alter == "" {
			continue
		}
		_, err = pool.Exec(t.Context(), sql(c.alter))
		require.NoError(t, err, c.name)
		s, err := migrate()
		require.ErrorIs(t, err, store.ErrEventsTableLayout, c.name)
		require.ErrorContains(t, err, "sequence "+sql(c.seq)+" has CACHE 20; the bridge needs CACHE 1", c.name)
		require.ErrorContains(t, err, "ALTER SEQUENCE "+sql(c.seq)+" CACHE 1", c.name)
		require.NotContains(t, jsbridgetest.SchemaShape(t, pool, s.Schema()), "streams", "%s: nothing created", c.name)
	}
}

// Migrate says what it applied; once up to date, nothing.
func TestMigrateAppliedListsWhatItCreated(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	s, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	applied, err := s.MigrateApplied(t.Context())
	require.NoError(t, err)
	require.Len(t, applied, 10)
	require.Equal(t, store.AppliedMigration{Version: 1, Name: "001_streams.sql",
		Objects: []string{"table " + schema + ".streams", "index streams_pending_idx"}}, applied[0])
	require.Equal(t, []string{"table " + schema + ".events", "function " + schema + ".jsbridge_events_inserted", "trigger jsbridge_events_inserted"}, applied[1].Objects)
	require.Equal(t, "003_discovery.sql", applied[2].Name)
	require.Equal(t, store.AppliedMigration{Version: 4, Name: "004_oldest_first.sql",
		Objects: []string{"column " + schema + ".streams.pending_since", "index streams_due_idx", "function " + schema + ".jsbridge_events_inserted"}}, applied[3])
	require.Equal(t, store.AppliedMigration{Version: 5, Name: "005_live_appends.sql",
		Objects: []string{"column " + schema + ".streams.pending", "index streams_claimable_idx", "function " + schema + ".jsbridge_events_inserted"}}, applied[4])
	require.Equal(t, store.AppliedMigration{Version: 6, Name: "006_idle_notify.sql",
		Objects: []string{"function " + schema + ".jsbridge_events_inserted"}}, applied[5])
	require.Equal(t, store.AppliedMigration{Version: 7, Name: "007_one_stream_append.sql",
		Objects: []string{"function " + schema + ".jsbridge_events_inserted"}}, applied[6])
	require.Equal(t, store.AppliedMigration{Version: 8, Name: "008_pending_append.sql",
		Objects: []string{"function " + schema + ".jsbridge_events_inserted"}}, applied[7])
	require.Equal(t, store.AppliedMigration{Version: 9, Name: "009_appended_marker.sql",
		Objects: []string{"table " + schema + ".appended", "function " + schema + ".jsbridge_events_inserted"}}, applied[8])
	require.Equal(t, store.AppliedMigration{Version: 10, Name: "010_new_stream_marker.sql",
		Objects: []string{"function " + schema + ".jsbridge_events_inserted"}}, applied[9])
	applied, err = s.MigrateApplied(t.Context())
	require.NoError(t, err)
	require.Empty(t, applied)

	b, err := foreignStore(t, "jsonb", "jsonb")
	require.NoError(t, err)
	schemaShape := jsbridgetest.SchemaShape(t, b.pool, b.store.Schema())
	require.NotContains(t, schemaShape, "events:")
	applied, err = b.store.MigrateApplied(b.ctx)
	require.NoError(t, err)
	require.Empty(t, applied, "foreignStore migrated already")
}

// A schema set up for an external events table records it: operator
// commands find it without being told, and migrating the schema as if it
// had its own events table is refused instead of creating an empty one.
func TestRecordedEventsTable(t *testing.T) {
	t.Parallel()
	b, err := foreignStore(t, "jsonb", "jsonb")
	require.NoError(t, err)
	b.insertRow(t, "a-1", 0, `{}`, `{}`)
	_, err = b.store.Discover(b.ctx)
	require.NoError(t, err)

	plain, err := store.New(b.pool, store.WithSchema(b.store.Schema()))
	require.NoError(t, err)
	table, err := plain.RecordedEventsTable(b.ctx)
	require.NoError(t, err)
	require.Equal(t, b.appTable, table)
	table, err = b.store.RecordedEventsTable(b.ctx)
	require.NoError(t, err)
	require.Equal(t, b.appTable, table)

	err = plain.Migrate(b.ctx)
	require.ErrorIs(t, err, store.ErrInvalidConfig)
	require.ErrorContains(t, err, "set up to drain the events table "+b.appTable)
	require.NotContains(t, jsbridgetest.SchemaShape(t, b.pool, b.store.Schema()), "events:", "no events table created")

	own := setup(t)
	table, err = own.store.RecordedEventsTable(own.ctx)
	require.NoError(t, err)
	require.Empty(t, table, "a schema with its own events table")
	fresh, err := store.New(b.pool, store.WithSchema(jsbridgetest.Schema(t, b.pool)))
	require.NoError(t, err)
	table, err = fresh.RecordedEventsTable(b.ctx)
	require.NoError(t, err)
	require.Empty(t, table, "a schema not set up yet")

	_, err = b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".discovery (events_table) VALUES ('other.events')")
	require.NoError(t, err)
	_, err = plain.RecordedEventsTable(b.ctx)
	require.ErrorContains(t, err, "several events tables")
	require.ErrorContains(t, err, b.appTable)
	require.ErrorContains(t, err, "other.events")
}

// Lag ages are never negative: an event whose created is ahead of the
// database clock (clock skew, or an app writing its own time) is 0 old.
func TestLagAgeIsNeverNegative(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".events (stream, version, name, data, created) VALUES ('future-1', 0, 'E', '{}', now() + interval '1 hour')")
	require.NoError(t, err)
	si := b.info(t, "future-1")
	require.EqualValues(t, 1, si.Lag)
	require.Zero(t, si.LagAge)
	bl, err := b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, bl.Lagging)
	require.Zero(t, bl.OldestAge)

	// A past event next to it gives the age of the oldest as usual.
	_, err = b.pool.Exec(b.ctx, "INSERT INTO "+b.store.Schema()+".events (stream, version, name, data, created) VALUES ('past-1', 0, 'E', '{}', now() - interval '1 minute')")
	require.NoError(t, err)
	bl, err = b.store.Backlog(b.ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, bl.OldestAge, time.Minute)
	require.Less(t, bl.OldestAge, time.Hour)
	require.GreaterOrEqual(t, b.info(t, "past-1").LagAge, time.Minute)
}
