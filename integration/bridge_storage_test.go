package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// `bridge run` against a JetStream whose max_file_store is reached: the
// EVENTS stream it created has the --max-age asked for; while publishes
// are refused /readyz answers 503 naming the cause under
// jetstream_storage, jsbridge_bus_unavailable{reason="storage"} is 1 and
// the outage is logged once; once space is freed it is ready again and
// every event is in JetStream.
func TestBridgeRunSaysAFullStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a bridge process and fills a JetStream store")
	}
	t.Parallel()
	b := setupOps(t)
	srv := jsbridgetest.StartJetStream(t, embedded.Config{MaxFileStore: 2 << 20})
	_, js := jsbridgetest.Connect(t, srv)
	ctx := context.Background()
	out, err := cli(t, b.env, "bridge", "migrate")
	require.NoError(t, err, out)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startBridgeProc(t, b.env, "--nats-url", srv.ClientURL(), "--ops-addr", addr, "--poll-interval", "100ms", "--max-age", "1h")
	waitReadyz(t, addr, 200)
	events, err := js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	require.Equal(t, time.Hour, events.CachedInfo().Config.MaxAge, "--max-age")
	require.Contains(t, p.out.String(), "JetStream stream retention")

	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	pad := make([]byte, 32<<10)
	for i := 0; ; i++ {
		if _, err := js.Publish(ctx, "filler.x", pad); err != nil {
			require.True(t, forward.IsStorageFull(err), "filling the store: %v", err)
			break
		}
		require.Less(t, i, 1000, "the store never filled")
	}
	const streams = 20
	appendRound(t, b.pool, b.schema, streams, 0)
	body := waitReadyz(t, addr, 503, "jetstream_storage", "JetStream refuses publishes for lack of storage", "insufficient resources")
	t.Logf("/readyz: %s", body)
	_, metrics := getBody("http://" + addr + "/metrics")
	require.Contains(t, metrics, `jsbridge_bus_unavailable{reason="storage"} 1`)
	appendRound(t, b.pool, b.schema, streams, 1)

	filler, err := js.Stream(ctx, "FILLER")
	require.NoError(t, err)
	require.NoError(t, filler.Purge(ctx))
	waitReadyz(t, addr, 200)
	require.Eventually(t, func() bool { return jsMessages(js) == 2*streams }, 90*time.Second, 50*time.Millisecond)
	_, metrics = getBody("http://" + addr + "/metrics")
	require.Contains(t, metrics, `jsbridge_bus_unavailable{reason="storage"} 0`)
	require.Equal(t, 1, strings.Count(p.out.String(), "JetStream refuses publishes for lack of storage"), "logged once per outage:\n%s", p.out.String())
}
