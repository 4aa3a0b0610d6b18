package drain_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// An app's table whose data and meta are text: it can hold what the
// bridge cannot forward (meta that is not JSON, NULL data).
const textTable = `CREATE TABLE %s.events (
    id      bigserial   PRIMARY KEY,
    stream  text        NOT NULL,
    version bigint      NOT NULL,
    name    text        NOT NULL,
    data    text,
    meta    text,
    created timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, version)
)`

// An event the store cannot read blocks its own stream at that event, after
// the events before it are handled; it never reaches the handler, the cycle
// does not fail, and every other stream goes on. A stream whose handler
// fails before the unreadable event is retried as usual, not blocked.
// Once the row is fixed, unblocking resumes the stream.
func TestUnreadableEventBlocksOnlyItsStream(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	ctx := t.Context()
	app := jsbridgetest.Schema(t, pool)
	table := app + ".events"
	_, err := pool.Exec(ctx, strings.ReplaceAll(textTable, "%s", app))
	require.NoError(t, err)
	s, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)), store.WithEventsTable(table))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	ids := map[string]int64{} // "stream/version" → id
	insert := func(stream string, version int, data, meta *string) {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+table+" (stream, version, name, data, meta) VALUES ($1, $2, 'Happened', $3, $4) RETURNING id",
			stream, version, data, meta).Scan(&id))
		ids[stream+"/"+strconv.Itoa(version)] = id
	}
	str := func(s string) *string { return &s }
	for v := range 5 {
		meta := str(`{"correlation": "c"}`)
		if v == 2 {
			meta = str(`{"correlation": "c"`) // cut short
		}
		insert("bad-1", v, str(`{}`), meta)
		insert("good-1", v, str(`{}`), nil)
	}
	insert("null-1", 0, nil, str(`{}`))
	insert("null-1", 1, str(`{}`), str(`{}`))
	insert("early-1", 0, str(`{}`), str(`{}`))
	insert("early-1", 1, str(`{}`), str(`not json`))
	_, err = s.Discover(ctx)
	require.NoError(t, err)

	failEarly := errors.New("bus said no")
	rec := newRecorder(func(b drain.Batch) drain.Result {
		for _, e := range b.Events {
			require.NoError(t, e.Err, "the handler got an unreadable event")
		}
		if b.Stream == "early-1" {
			return drain.Result{Err: failEarly}
		}
		return drain.Result{Done: len(b.Events)}
	})
	d, err := drain.New(s, rec, drain.Config{Logger: quiet()})
	require.NoError(t, err)
	st, err := d.Cycle(ctx)
	require.NoError(t, err, "an unreadable row must not fail the cycle")
	require.Equal(t, 4, st.Claimed)
	require.Equal(t, 2, st.Blocked)
	require.Equal(t, 1, st.Retried)
	require.Equal(t, 1, st.Acked)

	info := func(stream string) store.StreamInfo {
		infos, err := s.Streams(ctx, store.StreamFilter{Names: []string{stream}})
		require.NoError(t, err)
		require.Len(t, infos, 1)
		return infos[0]
	}
	bad := info("bad-1")
	require.True(t, bad.Blocked)
	require.EqualValues(t, 1, bad.Watermark, "the events before the unreadable one are forwarded")
	require.Contains(t, bad.Error, "event "+strconv.FormatInt(ids["bad-1/2"], 10)+" (version 2")
	require.Contains(t, bad.Error, "column meta of "+table)
	require.Contains(t, bad.Error, "not valid JSON")
	require.Equal(t, seq(2), rec.versions("bad-1"))

	null := info("null-1")
	require.True(t, null.Blocked)
	require.EqualValues(t, -1, null.Watermark)
	require.Contains(t, null.Error, "event "+strconv.FormatInt(ids["null-1/0"], 10)+" (version 0")
	require.Contains(t, null.Error, "column data of "+table+": is NULL")
	require.Empty(t, rec.versions("null-1"))

	early := info("early-1")
	require.False(t, early.Blocked, "the handler's own failure comes first: retried, not blocked")
	require.EqualValues(t, 1, early.Retry)
	require.Contains(t, early.Error, failEarly.Error())

	good := info("good-1")
	require.False(t, good.Blocked)
	require.EqualValues(t, 4, good.Watermark)
	require.Equal(t, seq(5), rec.versions("good-1"))

	// The app fixes its rows; unblocking resumes from the watermark.
	_, err = pool.Exec(ctx, "UPDATE "+table+` SET meta = '{"correlation": "fixed"}' WHERE id = $1`, ids["bad-1/2"])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+table+` SET data = '{"n": 0}' WHERE id = $1`, ids["null-1/0"])
	require.NoError(t, err)
	changed, err := s.Unblock(ctx, []string{"bad-1", "null-1"})
	require.NoError(t, err)
	require.Len(t, changed, 2)
	var fetched []event.Event
	rec.verdict = func(b drain.Batch) drain.Result {
		fetched = append(fetched, b.Events...)
		return drain.Result{Done: len(b.Events)}
	}
	st, err = d.Cycle(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Acked)
	require.Equal(t, seq(5), rec.versions("bad-1"))
	require.Equal(t, seq(2), rec.versions("null-1"))
	require.EqualValues(t, 4, info("bad-1").Watermark)
	require.EqualValues(t, 1, info("null-1").Watermark)
	for _, e := range fetched {
		if e.ID == ids["bad-1/2"] {
			require.Equal(t, "fixed", e.Meta.Correlation)
		}
	}
}
