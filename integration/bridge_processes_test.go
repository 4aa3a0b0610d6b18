package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// testJetStream starts an embedded JetStream server in the test process
// and returns it with a client.
func testJetStream(t *testing.T) (*embedded.Server, jetstream.JetStream) {
	t.Helper()
	srv := jsbridgetest.StartJetStream(t, embedded.Config{})
	_, js := jsbridgetest.Connect(t, srv)
	return srv, js
}

// appendRound appends one event to each of streams streams (order-0 ...)
// at version v, in one statement, as an application would in bulk.
func appendRound(t *testing.T, pool *pgxpool.Pool, schema string, streams, v int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "INSERT INTO "+schema+`.events (stream, version, name, data)
SELECT 'order-' || g, $1::bigint, 'OrderNoted', json_build_object('v', $1::bigint)::jsonb FROM generate_series(0, $2 - 1) g ORDER BY g`, v, streams)
	require.NoError(t, err)
}

// Four bridge processes drain 50,000 events over 1,000 streams; one is
// killed with SIGKILL in the middle of its batches and started again.
// JetStream ends up with every event exactly once, each stream in order:
// the killed bridge's streams are taken over after their lease, and what it
// published without acking is dropped by the duplicate window.
func TestBridgeProcessesFourBridgesSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	srv, js := testJetStream(t)
	out, err := cli(t, b.env, "bridge", "migrate")
	require.NoError(t, err, out)

	const streams, perStream = 1000, 50
	// A first round before the bridges start, the rest while they drain.
	appendRound(t, b.pool, b.schema, streams, 0)
	var procs []*bridgeProc
	for i := range 4 {
		procs = append(procs, startBridgeProc(t, b.env, "--nats-url", srv.ClientURL(), "--ops-addr", "",
			"--owner", fmt.Sprintf("bridge-%d", i), "--lease", "3s", "--claim-limit", "50", "--fetch-limit", "20",
			"--poll-interval", "100ms"))
	}
	// Kill bridge-0 while it holds leases (in the middle of its batches),
	// once a good part is forwarded; restart it under a new name, as a new
	// process would be.
	killed := false
	killMidBatch := func() {
		if killed || jsMessages(js) < 5_000 {
			return
		}
		var held int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+
			".streams WHERE leased_by = 'bridge-0' AND leased_until > now()").Scan(&held))
		if held == 0 {
			return
		}
		procs[0].kill()
		killed = true
		t.Logf("killed bridge-0 holding %d leases with %d events in JetStream", held, jsMessages(js))
		time.Sleep(time.Second)
		procs[0].args[slices.Index(procs[0].args, "bridge-0")] = "bridge-0-restarted"
		procs[0].start()
	}
	for v := 1; v < perStream; v++ {
		appendRound(t, b.pool, b.schema, streams, v)
		killMidBatch()
	}
	require.Eventually(t, func() bool {
		killMidBatch()
		return jsMessages(js) >= streams*perStream
	}, 5*time.Minute, 20*time.Millisecond, "JetStream holds %d of %d events", jsMessages(js), streams*perStream)
	require.True(t, killed, "bridge-0 was never seen holding a lease after 5,000 events")

	st, err := store.New(b.pool, store.WithSchema(b.schema))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		appended, forwarded, err := st.Totals(context.Background())
		return err == nil && appended == streams*perStream && forwarded == appended
	}, time.Minute, 200*time.Millisecond, "every watermark at its head")
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = perStream - 1
	}
	requireExactlyOnceInOrder(t, js, heads)
	blocked, err := st.Streams(context.Background(), store.StreamFilter{Blocked: true})
	require.NoError(t, err)
	require.Empty(t, blocked)
}

// privatePostgres starts a Postgres of the test's own with scripts/pg on a
// free port (the shared test server must not be restarted), and stops it
// and removes its data at cleanup. It returns its URL and functions that
// stop and start it.
func privatePostgres(t *testing.T) (url string, stop, start func()) {
	t.Helper()
	port := freePort(t)
	dir := fmt.Sprintf("/tmp/jsbridge-pg-%d", port)
	script, err := filepath.Abs("../scripts/pg")
	require.NoError(t, err)
	run := func(cmd string) string {
		c := exec.Command(script, cmd)
		c.Env = append(os.Environ(), "JSBRIDGE_PG_PORT="+strconv.Itoa(port), "JSBRIDGE_PG_DIR="+dir)
		out, err := c.Output()
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		require.NoError(t, err, "scripts/pg %s: %s", cmd, stderr)
		return strings.TrimSpace(string(out))
	}
	t.Cleanup(func() {
		c := exec.Command(script, "stop")
		c.Env = append(os.Environ(), "JSBRIDGE_PG_PORT="+strconv.Itoa(port), "JSBRIDGE_PG_DIR="+dir)
		_ = c.Run()
		_ = os.RemoveAll(dir)
	})
	url = run("start")
	return url, func() { run("stop") }, func() { run("start") }
}

// Postgres stopped and started again while the bridge drains: the bridge
// reconnects (its pool, its LISTEN: the restarted server shows its LISTEN
// session) and goes on; nothing is lost or duplicated.
func TestBridgeProcessesPostgresRestart(t *testing.T) {
	t.Parallel()
	url, stopPG, startPG := privatePostgres(t)
	srv, js := testJetStream(t)
	env := []string{"DATABASE_URL=" + url, "JSBRIDGE_SCHEMA=restart"}
	out, err := cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const streams = 50
	p := startBridgeProc(t, env, "--nats-url", srv.ClientURL(), "--ops-addr", "", "--poll-interval", "100ms", "--lease", "5s")
	for v := range 10 {
		appendRound(t, pool, "restart", streams, v)
	}
	require.Eventually(t, func() bool { return jsMessages(js) > 0 }, 30*time.Second, 50*time.Millisecond)

	stopPG()
	// The bridge sees the database gone: wait for it to say so, not for a
	// fixed time a loaded machine may stretch past its next cycle.
	require.Eventually(t, func() bool { return strings.Contains(p.output(), "drain cycle failed") }, time.Minute, 50*time.Millisecond,
		"the bridge never reported the outage; output:\n%s", p.output())
	startPG()

	for v := 10; v < 20; v++ {
		require.Eventually(t, func() bool {
			// The pool's connections died with the server; the first
			// statement after the restart may fail.
			_, err := pool.Exec(context.Background(), "INSERT INTO restart.events (stream, version, name, data) "+
				"SELECT 'order-' || g, $1, 'OrderNoted', '{}' FROM generate_series(0, $2 - 1) g ORDER BY g", v, streams)
			return err == nil
		}, 30*time.Second, 100*time.Millisecond)
	}
	require.Eventually(t, func() bool { return jsMessages(js) >= streams*20 }, 2*time.Minute, 100*time.Millisecond,
		"JetStream holds %d of %d events; bridge output:\n%s", jsMessages(js), streams*20, p.output())
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = 19
	}
	requireExactlyOnceInOrder(t, js, heads)
	require.Contains(t, p.output(), "drain cycle failed", "the outage was seen")
	require.Eventually(t, func() bool { return listeningSessions(t, pool, "restart") == 1 }, 10*time.Second, 50*time.Millisecond,
		"the bridge listens again on the restarted server")
}

// listeningSessions counts the sessions that LISTEN on schema's channel
// as a bridge does: the LISTEN is their last statement, or, once the
// bridge has been idle (migration 006), they hold an advisory lock
// exclusively, the idle lock the bridge takes on its listening session
// (other statements then come after the LISTEN).
func listeningSessions(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT a.pid) FROM pg_stat_activity a
LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
WHERE a.query = 'LISTEN ' || $1 OR l.pid IS NOT NULL`, schema).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}
