package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// foreignTable is an app's events table as an event-sourcing framework
// makes it: meta of the given type, nullable, and columns of its own.
const foreignTable = `CREATE TABLE %s.events (
    id       bigserial   PRIMARY KEY,
    stream   text        NOT NULL,
    version  bigint      NOT NULL,
    name     text        NOT NULL,
    data     jsonb       NOT NULL,
    meta     %s,
    created  timestamptz NOT NULL DEFAULT now(),
    tenant   text,
    UNIQUE (stream, version)
)`

// jsHeaders reads the whole EVENTS stream and returns each message's
// headers by Nats-Msg-Id.
func jsHeaders(t *testing.T, js jetstream.JetStream) map[string]nats.Header {
	t.Helper()
	out := map[string]nats.Header{}
	eachStoredMessage(t, js, func(h nats.Header) { out[h.Get(wire.HeaderMsgID)] = h })
	return out
}

// A table written by another framework, whose meta holds objects, numbers,
// arrays and keys of its own, drains completely, and the correlation and
// causation headers are what the README's "Subjects and headers" says.
// `bridge streams --schema X` then lists its streams without being given
// --events-table again.
func TestBridgeOpsForeignMetaDrainsWithDocumentedHeaders(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	ctx := context.Background()
	app := jsbridgetest.Schema(t, b.pool)
	table := app + ".events"
	_, err := b.pool.Exec(ctx, fmt.Sprintf(foreignTable, app, "jsonb"))
	require.NoError(t, err)
	env := append(b.env, "JSBRIDGE_EVENTS_TABLE="+table)

	cases := []struct {
		meta                   any    // nil: NULL
		correlation, causation string // header values; "": no header
	}{
		{`{"correlation": "c-0", "causation": {}}`, "c-0", "{}"},
		{`{"correlation": 7, "causation": {"id": "e-1", "by": "svc a"}, "trace": {"span": {"id": 1, "tags": ["x"]}}}`,
			"7", `{%22by%22:%22svc%20a%22,%22id%22:%22e-1%22}`}, // jsonb orders keys its way
		{`{"correlation": ["a", 1], "causation": true}`, `[%22a%22,1]`, "true"},
		{`{"correlation": "café", "causation": null}`, "caf%C3%A9", ""},
		{`{"correlation": "", "user": "u-1"}`, "", ""},
		{`[{"correlation": "c-1"}]`, "", ""},
		{`"c-1"`, "", ""},
		{`12`, "", ""},
		{nil, "", ""},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+table+` (stream, version, name, data, meta, tenant)
VALUES ('meta-' || ($1::int % 3), $1::int / 3, 'Happened', '{"n": 1}', $2::jsonb, 't-1') RETURNING id`, i, c.meta).Scan(&id))
		ids[i] = strconv.FormatInt(id, 10)
	}

	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	srv, js := testJetStream(t)
	p := startBridgeProc(t, env, "--nats-url", srv.ClientURL(), "--ops-addr", "", "--poll-interval", "50ms")
	require.Eventually(t, func() bool { return jsMessages(js) >= uint64(len(cases)) }, 30*time.Second, 50*time.Millisecond,
		"JetStream holds %d of %d events:\n%s", jsMessages(js), len(cases), p.output())
	requireExactlyOnceInOrder(t, js, map[string]int64{"meta-0": 2, "meta-1": 2, "meta-2": 2})

	headers := jsHeaders(t, js)
	for i, c := range cases {
		h := headers[ids[i]]
		require.NotNil(t, h, "event %s not in JetStream", ids[i])
		for _, hv := range []struct{ name, want string }{
			{wire.HeaderCorrelationID, c.correlation}, {wire.HeaderCausationID, c.causation},
		} {
			if hv.want == "" {
				require.NotContains(t, h, hv.name, "meta %v", c.meta)
			} else {
				require.Equal(t, []string{hv.want}, h.Values(hv.name), "%s of meta %v", hv.name, c.meta)
			}
		}
		require.Equal(t, ids[i], h.Get(wire.HeaderID))
	}

	// Without --events-table: the schema knows the table it drains.
	out, err = cli(t, b.env, "bridge", "streams", "--schema", b.schema, "--json")
	require.NoError(t, err, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	for _, line := range lines {
		var row streamRowJSON
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		require.EqualValues(t, 2, row.Watermark, line)
		require.EqualValues(t, 2, row.Head, line)
		require.GreaterOrEqual(t, row.LagSeconds, 0.0, line)
	}
}

// streamRowJSON is a line of `bridge streams --json`.
type streamRowJSON struct {
	Stream     string  `json:"stream"`
	Watermark  int64   `json:"watermark"`
	Head       int64   `json:"head"`
	LagSeconds float64 `json:"lag_seconds"`
	Blocked    bool    `json:"blocked"`
	Error      string  `json:"error"`
}

// One row whose meta is not JSON (a text column can hold anything) blocks
// its own stream at that event, with an error naming the event id and the
// column, in `bridge streams --blocked`, the blocked gauge and the log;
// 1,000 other streams drain meanwhile and no drain cycle fails. Once the app
// fixes the row, `bridge unblock` resumes the stream and it drains whole.
func TestBridgeOpsUnreadableMetaBlocksOnlyItsStream(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	ctx := context.Background()
	app := jsbridgetest.Schema(t, b.pool)
	table := app + ".events"
	_, err := b.pool.Exec(ctx, fmt.Sprintf(foreignTable, app, "text"))
	require.NoError(t, err)
	env := append(b.env, "JSBRIDGE_EVENTS_TABLE="+table)

	const streams, perStream = 1000, 3
	// The poison stream's events are spread among the others' ids.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+table+` (stream, version, name, data, meta)
SELECT 'acct-' || (g % $1::int), g / $1::int, 'Deposited', jsonb_build_object('g', g), '{"correlation": "c"}'
FROM generate_series(0, $1::int * $2::int - 1) g ORDER BY g`, streams, perStream)
	require.NoError(t, err)
	var badID int64
	for v := range 5 {
		meta := `{"correlation": "c"}`
		if v == 2 {
			meta = `{"correlation": "c", "causation": ` // cut short
		}
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, "INSERT INTO "+table+` (stream, version, name, data, meta)
VALUES ('poison-1', $1, 'Happened', '{}', $2) RETURNING id`, v, meta).Scan(&id))
		if v == 2 {
			badID = id
		}
	}

	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	srv, js := testJetStream(t)
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startBridgeProc(t, env, "--nats-url", srv.ClientURL(), "--ops-addr", opsAddr,
		"--poll-interval", "50ms", "--log-format", "json")

	total := uint64(streams*perStream + 2)
	require.Eventually(t, func() bool { return jsMessages(js) >= total }, 90*time.Second, 100*time.Millisecond,
		"JetStream holds %d of %d events:\n%s", jsMessages(js), total, p.output())
	heads := map[string]int64{"poison-1": 1}
	for s := range streams {
		heads["acct-"+strconv.Itoa(s)] = perStream - 1
	}
	requireExactlyOnceInOrder(t, js, heads)

	require.Eventually(t, func() bool {
		v, _ := metric(t, opsAddr, "jsbridge_bridge_streams_blocked")
		return v == 1
	}, 30*time.Second, 50*time.Millisecond, "blocked gauge never reached 1")
	out, err = cli(t, env, "bridge", "streams", "--blocked", "--json")
	require.NoError(t, err, out)
	var row streamRowJSON
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &row), "only one blocked stream: %s", out)
	require.Equal(t, "poison-1", row.Stream)
	require.EqualValues(t, 1, row.Watermark, "the events before the bad one are forwarded")
	require.Contains(t, row.Error, fmt.Sprintf("event %d (version 2,", badID))
	require.Contains(t, row.Error, "column meta of "+table+": not valid JSON")
	logs := p.output()
	require.Contains(t, logs, `"msg":"stream blocked"`)
	require.Contains(t, logs, fmt.Sprintf(`"event_id":%d`, badID))
	require.NotContains(t, logs, "drain cycle failed", "a bad row must not fail a drain cycle")

	// The app fixes its row; unblocking resumes the stream from its watermark.
	_, err = b.pool.Exec(ctx, "UPDATE "+table+` SET meta = '{"correlation": "c", "causation": "fixed"}' WHERE id = $1`, badID)
	require.NoError(t, err)
	out, err = cli(t, env, "bridge", "unblock", "poison-1")
	require.NoError(t, err, out)
	require.Contains(t, out, "unblocked poison-1 (was blocked")
	require.Eventually(t, func() bool {
		v, _ := metric(t, opsAddr, "jsbridge_bridge_streams_blocked")
		wm, blocked, _, ok := b.streamRow(t, "poison-1")
		return ok && v == 0 && wm == 4 && !blocked
	}, 30*time.Second, 100*time.Millisecond, "poison-1 never resumed:\n%s", p.output())
	heads["poison-1"] = 4
	requireExactlyOnceInOrder(t, js, heads)
	h := jsHeaders(t, js)[strconv.FormatInt(badID, 10)]
	require.Equal(t, "fixed", h.Get(wire.HeaderCausationID))
}
