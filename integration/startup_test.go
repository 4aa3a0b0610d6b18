package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// getBody returns a GET's status and body (0 and the error text when the
// request failed).
func getBody(rawURL string) (int, string) {
	resp, err := http.Get(rawURL)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReadyz waits until /readyz at addr answers status with a body
// containing every one of parts, up to 60 s (a start-up's backoff under
// the whole suite's load can take more than 30 s), and fails naming the
// last answer.
func waitReadyz(t *testing.T, addr string, status int, parts ...string) string {
	t.Helper()
	matches := func(code int, body string) bool {
		if code != status {
			return false
		}
		for _, p := range parts {
			if !strings.Contains(body, p) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := getBody("http://" + addr + "/readyz")
		if matches(code, body) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz of %s: want %d with %q, last %d %q", addr, status, parts, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requireRunsUntil fails when p exits before the deadline.
func requireRunsUntil(t *testing.T, p *proc, deadline time.Time) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("process exited (%v) before it was stopped; output:\n%s", p.err, p.out.String())
	case <-time.After(time.Until(deadline)):
	}
}

// The bridge and the consumer both start while NATS is down; it comes up
// 10 s later on the same address. Meanwhile each serves /healthz, says on
// /readyz that it waits for NATS, and logs one warning per attempt; then
// each becomes ready without a restart (the consumer also waits for the
// bridge's stream) and every event appended meanwhile is delivered.
func TestStartupBridgeAndConsumerWaitForNATS(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	out, err := cli(t, b.env, "bridge", "migrate")
	require.NoError(t, err, out)
	natsSrv := newNATSProc(t)
	rc, rsrv := newRecorder(t)
	bridgeOps, consumerOps := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	started := time.Now()
	bridge := startProc(t, b.env, "bridge", "run", "--nats-url", natsSrv.url(), "--ops-addr", bridgeOps, "--poll-interval", "100ms")
	consumer := startProc(t, []string{"JSBRIDGE_SECRET=" + testSecret}, "consumer", "run", "--nats-url", natsSrv.url(), "--start", "all",
		"--name", "late", "--url", rsrv.URL, "--allow-private", "--ops-addr", consumerOps)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bridge output:\n%s\nconsumer output:\n%s", bridge.out.String(), consumer.out.String())
		}
	})

	waiting := "startup: waiting for NATS at " + natsSrv.url()
	for _, addr := range []string{bridgeOps, consumerOps} {
		waitReadyz(t, addr, http.StatusServiceUnavailable, waiting, "jetstream: not connected to NATS yet")
		code, _ := getBody("http://" + addr + "/healthz")
		require.Equal(t, http.StatusOK, code, "/healthz of %s while waiting", addr)
	}
	const streams, rounds = 20, 5
	for v := range rounds {
		appendRound(t, b.pool, b.schema, streams, v)
	}

	// The backlog gauges come from Postgres: exported while NATS is away.
	require.Eventually(t, func() bool {
		code, body := getBody("http://" + bridgeOps + "/metrics")
		return code == http.StatusOK && strings.Contains(body, fmt.Sprintf("jsbridge_bridge_streams_lagging %d", streams))
	}, 10*time.Second, 100*time.Millisecond, "the bridge's /metrics shows the lagging streams while it waits for NATS")

	requireRunsUntil(t, bridge, started.Add(10*time.Second))
	requireRunsUntil(t, consumer, started.Add(10*time.Second))
	natsSrv.start()
	waitReadyz(t, bridgeOps, http.StatusOK, "ready")
	waitReadyz(t, consumerOps, http.StatusOK, "ready")
	require.Eventually(t, func() bool { return rc.count() == streams*rounds }, time.Minute, 50*time.Millisecond,
		"receiver got %d of %d events", rc.count(), streams*rounds)

	// One warning per attempt, with backoff: 0.5 s doubling gives about 6
	// attempts in 10 s, not one per reconnect tick.
	for name, p := range map[string]*proc{"bridge": bridge, "consumer": consumer} {
		n := strings.Count(p.out.String(), `msg="waiting for NATS at `+natsSrv.url()+`"`)
		require.True(t, n >= 3 && n <= 10, "%s logged %d waiting lines in 10 s:\n%s", name, n, p.out.String())
	}
}

// The bridge starts while its Postgres is down and becomes ready when it
// comes up 10 s later. Postgres then restarts under the running bridge:
// /readyz says so, and after it the bridge goes on, woken by NOTIFY (its
// poll interval is a minute, so the LISTEN was re-established).
func TestStartupBridgeWaitsForPostgresAndListensAgainAfterARestart(t *testing.T) {
	t.Parallel()
	dbURL, stopPG, startPG := privatePostgres(t)
	stopPG()
	srv, js := testJetStream(t)
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	started := time.Now()
	bridge := startProc(t, []string{"DATABASE_URL=" + dbURL, "JSBRIDGE_SCHEMA=late"}, "bridge", "run",
		"--nats-url", srv.ClientURL(), "--ops-addr", opsAddr, "--poll-interval", "1m")
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	waitReadyz(t, opsAddr, http.StatusServiceUnavailable, "startup: waiting for Postgres at 127.0.0.1:"+u.Port()+"/jsbridge", "postgres: ")

	requireRunsUntil(t, bridge, started.Add(10*time.Second))
	startPG()
	waitReadyz(t, opsAddr, http.StatusOK, "ready")
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const streams = 10
	insert := func(v int) {
		t.Helper()
		require.Eventually(t, func() bool {
			// The pool's connections die with the server: the first
			// statement after a restart may fail.
			_, err := pool.Exec(context.Background(), "INSERT INTO late.events (stream, version, name, data) "+
				"SELECT 'order-' || g, $1, 'OrderNoted', '{}' FROM generate_series(0, $2 - 1) g ORDER BY g", v, streams)
			return err == nil
		}, 30*time.Second, 100*time.Millisecond)
	}
	insert(0)
	require.Eventually(t, func() bool { return jsMessages(js) == streams }, 20*time.Second, 50*time.Millisecond,
		"JetStream holds %d of %d events", jsMessages(js), streams)

	stopPG()
	waitReadyz(t, opsAddr, http.StatusServiceUnavailable, "postgres: ")
	startPG()
	waitReadyz(t, opsAddr, http.StatusOK, "ready")
	insert(1)
	require.Eventually(t, func() bool { return jsMessages(js) == 2*streams }, 20*time.Second, 50*time.Millisecond,
		"JetStream holds %d of %d events (a minute's poll would be too late)", jsMessages(js), 2*streams)
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = 1
	}
	requireExactlyOnceInOrder(t, js, heads)
	require.Contains(t, bridge.out.String(), `msg="waiting for Postgres at 127.0.0.1:`+u.Port()+`/jsbridge"`)
}

// An endpoint that refuses connections, every event given up on after one
// attempt and a 2 s breaker open timeout: the breaker opens, its half-open
// probes dead-letter the rest one by one and then find nothing to fetch,
// which used to end the process ("fetch probe message: nats: timeout").
// The consumer runs for 30 s (the requirement), /readyz stays 200 (NATS,
// the events and DLQ streams are there; an endpoint being down is not the
// consumer's readiness), and every event, published by the bridge's
// forwarder with its fence headers, is in the DLQ.
func TestStartupConsumerOutlivesADeadEndpoint(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
	dead := fmt.Sprintf("http://127.0.0.1:%d/hook", freePort(t)) // nothing listens there
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	started := time.Now()
	consumer := startProc(t, []string{"JSBRIDGE_SECRET=" + testSecret}, "consumer", "run", "--nats-url", b.srv.ClientURL(), "--start", "all",
		"--name", "dead", "--url", dead, "--allow-private", "--max-deliver", "1", "--breaker-open-timeout", "2s",
		"--max-in-flight", "2", "--backoff", "100ms", "--ops-addr", opsAddr, "--on-dead-letter", "skip")
	waitReadyz(t, opsAddr, http.StatusOK, "ready")

	fwd, err := forward.New(b.js, forward.Config{Stream: "EVENTS"})
	require.NoError(t, err)
	const streams, rounds = 3, 4
	id := int64(0)
	for v := range rounds {
		var evs []event.Event
		for s := range streams {
			id++
			evs = append(evs, event.Event{ID: id, Stream: fmt.Sprintf("order-%d", s), Version: int64(v), Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()})
		}
		for _, o := range fwd.Publish(b.ctx, evs) {
			require.NoError(t, o.Err)
		}
	}
	q := deadletter.New(b.js, deadletter.Config{})
	var n uint64
	ok := waitFor(time.Minute, func() bool {
		var err error
		n, err = q.Count(b.ctx, "dead")
		return err == nil && n == uint64(id)
	})
	// The output as it is now, not as it was when the wait began.
	require.True(t, ok, "every event dead-lettered (%d of %d); consumer output:\n%s", n, id, consumer.out.String())

	requireRunsUntil(t, consumer, started.Add(30*time.Second))
	code, body := getBody("http://" + opsAddr + "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, metricsText(t, opsAddr), fmt.Sprintf(`jsbridge_consumer_dead_letters_total{subscription="dead"} %d`, id))
	require.Contains(t, metricsText(t, opsAddr), `jsbridge_consumer_breaker_transitions_total{endpoint="`+dead+`",from="half-open",to="open"}`,
		"the breaker went half-open and probed")
	require.NotContains(t, consumer.out.String(), "fetch probe message")
	require.NotContains(t, consumer.out.String(), "level=ERROR msg=\"dead letter failed")
}

// Events drained by the bridge process (fast batches and single publishes,
// each fenced with Nats-Expected-Last-Subject-Sequence) that one endpoint
// rejects (422) and another fails until MaxDeliver: every one of them is
// in the DLQ, for both subscriptions, counted one by one.
func TestStartupEveryBridgePublishedEventIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	srv, js := testJetStream(t)
	rejecting := newHits(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnprocessableEntity) })
	failing := newHits(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	cfg := filepath.Join(t.TempDir(), "subs.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: rejected, filter_subjects: [events.>], url: %q, secrets_env: [JSBRIDGE_SECRET], allow_private: true, on_dead_letter: skip, start: all}
  - {name: exhausted, filter_subjects: [events.>], url: %q, secrets_env: [JSBRIDGE_SECRET], allow_private: true, max_deliver: 2, backoff: [50ms], on_dead_letter: skip, start: all}
`, rejecting.URL, failing.URL), 0o600))
	startProc(t, b.env, "bridge", "run", "--nats-url", srv.ClientURL(), "--ops-addr", "", "--poll-interval", "100ms")
	startProc(t, []string{"JSBRIDGE_SECRET=" + testSecret}, "consumer", "run", "--nats-url", srv.ClientURL(), "--config", cfg, "--ops-addr", "")

	const streams, rounds = 40, 5
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(context.Background(), "SELECT 1 FROM "+b.schema+".events LIMIT 1")
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the bridge migrated its schema")
	// One round at a time: each round's publishes are then fenced on the
	// message the round before stored (a first publish is fenced on 0,
	// which the DLQ happened to accept).
	for v := range rounds {
		appendRound(t, b.pool, b.schema, streams, v)
		require.Eventually(t, func() bool { return jsMessages(js) == uint64(streams*(v+1)) }, 30*time.Second, 20*time.Millisecond)
	}
	q := deadletter.New(js, deadletter.Config{})
	ctx := context.Background()
	for _, name := range []string{"rejected", "exhausted"} {
		require.Eventually(t, func() bool {
			n, err := q.Count(ctx, name)
			return err == nil && n == streams*rounds
		}, 2*time.Minute, 100*time.Millisecond, "subscription %s: dead letters", name)
	}
	letters, err := q.List(ctx, "")
	require.NoError(t, err)
	ids := map[string]map[string]bool{"rejected": {}, "exhausted": {}}
	for _, d := range letters {
		ids[d.Subscription][d.EventID] = true
		for k := range d.Header {
			if strings.HasPrefix(strings.ToLower(k), "nats-") {
				require.Equal(t, "Nats-Msg-Id", k, "dead letter %d carries %s", d.Seq, k)
			}
		}
	}
	require.Len(t, ids["rejected"], streams*rounds, "distinct events dead-lettered")
	require.Len(t, ids["exhausted"], streams*rounds, "distinct events dead-lettered")
	require.Equal(t, streams*rounds, rejecting.count(), "a 422 is tried once")
	require.Equal(t, 2*streams*rounds, failing.count(), "MaxDeliver 2: two attempts each")
}

// What waiting cannot fix ends the process at once with a message that
// says what: credentials NATS refuses, a database that does not exist, an
// events stream whose subjects another stream holds.
func TestStartupBadCredentialsAndConfigurationExit(t *testing.T) {
	t.Parallel()
	binaries(t) // built before anything is timed
	b := setupOps(t)
	tokenSrv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, Authorization: "s3cret", NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go tokenSrv.Start()
	require.True(t, tokenSrv.ReadyForConnections(10*time.Second))
	t.Cleanup(tokenSrv.Shutdown)

	exits := func(env []string, bin string, args ...string) string {
		t.Helper()
		start := time.Now()
		out, err := cli(t, env, bin, args...)
		require.Error(t, err, "%s %v must fail; output:\n%s", bin, args, out)
		require.Less(t, time.Since(start), 20*time.Second, "it fails at once, it does not wait")
		return out
	}
	out := exits([]string{"JSBRIDGE_SECRET=" + testSecret}, "consumer", "run", "--nats-url", tokenSrv.ClientURL(),
		"--url", "http://127.0.0.1:1/", "--allow-private", "--ops-addr", "")
	require.Contains(t, strings.ToLower(out), "authorization violation")
	require.Contains(t, out, "refused")

	out = exits(b.env, "bridge", "run", "--nats-url", tokenSrv.ClientURL(), "--ops-addr", "")
	require.Contains(t, strings.ToLower(out), "authorization violation")

	u, err := url.Parse(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	u.Path = "/no_such_database"
	out = exits([]string{"DATABASE_URL=" + u.String()}, "bridge", "run", "--nats-url", "nats://127.0.0.1:1", "--ops-addr", "")
	require.Contains(t, out, `database "no_such_database" does not exist`)

	js := setupJetStream(t) // EVENTS holds events.>
	out = exits(b.env, "bridge", "run", "--nats-url", js.srv.ClientURL(), "--stream", "OTHER", "--ops-addr", "")
	require.Contains(t, out, "subjects overlap with an existing stream")
	require.Contains(t, out, `JetStream stream "OTHER"`)
}

// --startup-timeout gives up waiting: exit 1 naming what was missing. A
// SIGTERM while waiting is a clean, prompt exit 0.
func TestStartupTimeoutAndSIGTERMWhileWaiting(t *testing.T) {
	t.Parallel()
	binaries(t) // built before anything is timed
	b := setupOps(t)
	down := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	consumerArgs := []string{"run", "--nats-url", down, "--url", "http://127.0.0.1:1/", "--allow-private", "--ops-addr", ""}

	for _, c := range []struct {
		bin  string
		env  []string
		args []string
	}{
		{"bridge", b.env, []string{"run", "--nats-url", down, "--ops-addr", ""}},
		{"consumer", env, consumerArgs},
	} {
		start := time.Now()
		out, err := cli(t, c.env, c.bin, append(c.args, "--startup-timeout", "2s")...)
		require.Error(t, err, out)
		require.Contains(t, out, "--startup-timeout 2s passed while still waiting for NATS at "+down, out)
		took := time.Since(start)
		require.True(t, took >= 2*time.Second && took < 15*time.Second, "%s gave up after %s", c.bin, took)
	}

	for _, c := range []struct {
		bin  string
		env  []string
		args []string
	}{
		{"bridge", b.env, []string{"run", "--nats-url", down}},
		{"consumer", env, []string{"run", "--nats-url", down, "--url", "http://127.0.0.1:1/", "--allow-private"}},
	} {
		opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := startProc(t, c.env, c.bin, append(c.args, "--ops-addr", opsAddr)...)
		waitReadyz(t, opsAddr, http.StatusServiceUnavailable, "startup: waiting for NATS at "+down)
		stopped := time.Now()
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still running 10 s after SIGTERM while waiting for NATS", c.bin)
		}
		require.NoError(t, p.err, "%s exit status after SIGTERM while waiting; output:\n%s", c.bin, p.out.String())
		require.Less(t, time.Since(stopped), 5*time.Second, c.bin)
	}
}
