package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/store"
)

// `bridge run --max-age 2s`: a stream idle past it, then appended to, is
// forwarded, not blocked; `bridge verify --repair` reports its earlier
// events aged out, 0 missing, re-publishes nothing and exits 0.
func TestBridgeRunMaxAgeAgedOutStreamVerifiesClean(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a bridge process and waits for events to age out")
	}
	t.Parallel()
	b := setupOps(t)
	srv, js := testJetStream(t)
	out, err := cli(t, b.env, "bridge", "migrate")
	require.NoError(t, err, out)
	env := append(b.env, "NATS_URL="+srv.ClientURL())
	startBridgeProc(t, env, "--ops-addr", "", "--poll-interval", "100ms", "--max-age", "2s", "--duplicate-window", "1s")
	const streams = 5
	appendRound(t, b.pool, b.schema, streams, 0)
	appendRound(t, b.pool, b.schema, streams, 1)
	require.Eventually(t, func() bool { return jsMessages(js) == 2*streams }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return jsMessages(js) == 0 }, 30*time.Second, 100*time.Millisecond, "aged out")

	appendRound(t, b.pool, b.schema, streams, 2)
	st, err := store.New(b.pool, store.WithSchema(b.schema))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		appended, forwarded, err := st.Totals(context.Background())
		return err == nil && appended == 3*streams && forwarded == appended
	}, 30*time.Second, 50*time.Millisecond, "every watermark at its head")
	blocked, err := st.Streams(context.Background(), store.StreamFilter{Blocked: true})
	require.NoError(t, err)
	require.Empty(t, blocked)

	stdout, stderr, code := verifyCLI(t, env, "--repair", "--json")
	require.Equal(t, 0, code, "%s%s", stdout, stderr)
	dec := json.NewDecoder(strings.NewReader(stdout))
	var summary map[string]any
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		require.Equal(t, true, obj["summary"], "no problem line: %v", obj)
		summary = obj
	}
	require.NotNil(t, summary, stdout)
	// The third round may age out too before verify reads it.
	aged := summary["aged_out"].(float64)
	require.GreaterOrEqual(t, aged, float64(2*streams), fmt.Sprint(summary))
	require.EqualValues(t, 0, summary["problems"].(map[string]any)["missing"])
	require.EqualValues(t, 0, summary["repaired"])
	require.EqualValues(t, 0, summary["left"])
	require.LessOrEqual(t, jsMessages(js), uint64(streams), "repair published nothing")
}
