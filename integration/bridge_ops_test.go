package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// bridgeProc is a `bridge run` process the test may SIGKILL and start
// again; at cleanup it gets SIGTERM and must exit 0 within 20 s.
type bridgeProc struct {
	t    *testing.T
	env  []string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan error
}

// lockedBuffer collects a process's output. Unlike an embedded
// bytes.Buffer it has no ReadFrom for os/exec to call without the lock.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

func startBridgeProc(t *testing.T, env []string, args ...string) *bridgeProc {
	t.Helper()
	p := &bridgeProc{t: t, env: env, args: append([]string{"run"}, args...)}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *bridgeProc) start() {
	p.t.Helper()
	cmd := exec.Command(filepath.Join(binaries(p.t), "bridge"), p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(p.t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	p.mu.Lock()
	p.cmd, p.out, p.done = cmd, out, done
	p.mu.Unlock()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *bridgeProc) kill() {
	p.t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	require.NoError(p.t, cmd.Process.Signal(syscall.SIGKILL))
	<-done
}

func (p *bridgeProc) stop() {
	p.mu.Lock()
	cmd, done, out := p.cmd, p.done, p.out
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("bridge exited with %v after SIGTERM; output:\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		p.t.Errorf("bridge did not exit within 20 s of SIGTERM; output:\n%s", out.String())
	}
}

func (p *bridgeProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// metric returns the value of an unlabelled metric in a /metrics page, and
// whether it was there.
func metric(t *testing.T, opsAddr, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + opsAddr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, sc.Text())
			return f, true
		}
	}
	return 0, false
}

// jsMessages returns how many messages the EVENTS stream holds (0 when it
// does not exist yet or the server is down).
func jsMessages(js jetstream.JetStream) uint64 { return streamMessages(js, "EVENTS") }

// streamMessages returns the number of messages JetStream stream name
// holds (0 when it cannot be read).
func streamMessages(js jetstream.JetStream, name string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// eachStoredMessage reads the whole EVENTS stream with an ordered consumer
// (no durable state on the server) and calls fn with each message's
// headers, in stored order.
func eachStoredMessage(t *testing.T, js jetstream.JetStream, fn func(h nats.Header)) {
	t.Helper()
	eachMessageOf(t, js, "EVENTS", fn)
}

// eachMessageOf reads the whole JetStream stream name as eachStoredMessage
// reads EVENTS.
func eachMessageOf(t *testing.T, js jetstream.JetStream, name string, fn func(h nats.Header)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	want := streamMessages(js, name)
	if want == 0 {
		return
	}
	// Retried: right after a cluster node restarts, the server a client
	// is connected to may answer "no responders" for a moment.
	var cons jetstream.Consumer
	var err error
	require.Eventually(t, func() bool {
		cons, err = js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "ordered consumer on %s: %v", name, err)
	// Retried: the ordered consumer recreates itself on the server when
	// its node went away, and goes on after the last message it gave.
	for got := uint64(0); got < want; {
		// Ask for no more than is left: Fetch returns once it has them.
		batch, err := cons.Fetch(int(min(want-got, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err == nil {
			for m := range batch.Messages() {
				got++
				fn(m.Headers())
			}
			err = batch.Error()
		}
		if err != nil {
			require.NoError(t, ctx.Err(), "read %s: %d of %d messages: %v", name, got, want, err)
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// jsStreamEvents reads the whole JetStream stream name and returns, per
// source stream, the versions in stored order, and the number of times
// each event id was stored.
func jsStreamEvents(t *testing.T, js jetstream.JetStream, name string) (map[string][]int64, map[string]int) {
	t.Helper()
	versions := map[string][]int64{}
	ids := map[string]int{}
	eachMessageOf(t, js, name, func(h nats.Header) {
		v, err := strconv.ParseInt(h.Get(wire.HeaderStreamVersion), 10, 64)
		require.NoError(t, err)
		stream := h.Get(wire.HeaderSubject)
		versions[stream] = append(versions[stream], v)
		ids[h.Get(wire.HeaderMsgID)]++
	})
	return versions, ids
}

// requireExactlyOnceInOrder checks that the EVENTS stream holds exactly the
// events heads says (stream -> last version), each once, each stream in
// order.
func requireExactlyOnceInOrder(t *testing.T, js jetstream.JetStream, heads map[string]int64) {
	t.Helper()
	requireStreamExactlyOnceInOrder(t, js, "EVENTS", heads)
}

// requireStreamExactlyOnceInOrder checks JetStream stream name as
// requireExactlyOnceInOrder checks EVENTS.
func requireStreamExactlyOnceInOrder(t *testing.T, js jetstream.JetStream, name string, heads map[string]int64) {
	t.Helper()
	versions, ids := jsStreamEvents(t, js, name)
	for id, n := range ids {
		require.Equal(t, 1, n, "%s: event %s stored %d times", name, id, n)
	}
	require.Len(t, versions, len(heads), "streams in %s", name)
	for stream, head := range heads {
		vs := versions[stream]
		require.Len(t, vs, int(head+1), "%s: stream %s", name, stream)
		for i, v := range vs {
			require.Equal(t, int64(i), v, "%s: stream %s: position %d holds version %d", name, stream, i, v)
		}
	}
}

type opsBundle struct {
	pool   *pgxpool.Pool
	schema string
	env    []string
}

func setupOps(t *testing.T) opsBundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	return opsBundle{pool: pool, schema: schema, env: []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema}}
}

func (b opsBundle) streamRow(t *testing.T, stream string) (watermark int64, blocked bool, errText string, ok bool) {
	t.Helper()
	out, err := cli(t, b.env, "bridge", "streams", "--json", "--match", "^"+stream+"$")
	if err != nil {
		return 0, false, "", false
	}
	var row struct {
		Watermark int64  `json:"watermark"`
		Blocked   bool   `json:"blocked"`
		Error     string `json:"error"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(out)), &row) != nil {
		return 0, false, "", false
	}
	return row.Watermark, row.Blocked, row.Error, true
}

// A poison event (over JetStream's max payload) blocks only its stream, and
// the blocked gauge shows it: 0, then 1, then 0 again after `bridge unblock`
// once the limit is raised. `bridge reset --yes` re-publishes the stream
// from its first event and JetStream's duplicate window drops every copy.
func TestBridgeOpsPoisonBlocksOnlyItsStreamUnblockAndReset(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	// The server is restarted below on the same port; another test may
	// take that port while it is down, so the bridge and the test also
	// know a second one to restart on.
	dir, natsPort, altPort := t.TempDir(), freePort(t), freePort(t)
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: natsPort, MaxPayload: 4096})
	require.NoError(t, err)
	var srvMu sync.Mutex
	t.Cleanup(func() {
		srvMu.Lock()
		if srv != nil {
			srv.Shutdown()
		}
		srvMu.Unlock()
	})
	urls := srv.ClientURL() + "," + fmt.Sprintf("nats://127.0.0.1:%d", altPort)
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	out, err := cli(t, b.env, "bridge", "migrate")
	require.NoError(t, err, out)
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startBridgeProc(t, b.env, "--nats-url", urls, "--ops-addr", opsAddr,
		"--poll-interval", "100ms", "--lease", "5s", "--log-format", "json")
	waitHTTP200(t, "http://"+opsAddr+"/readyz")
	blocked, ok := metric(t, opsAddr, "jsbridge_bridge_streams_blocked")
	require.True(t, ok, "blocked gauge exported before any stream exists")
	require.Zero(t, blocked)

	big := `{"blob":"` + strings.Repeat("x", 6000) + `"}`
	for _, e := range []struct{ stream, data string }{
		{"order-1", `{"n":0}`}, {"order-1", big}, {"order-1", `{"n":2}`},
		{"order-2", `{"n":0}`}, {"order-2", `{"n":1}`},
	} {
		out, err := cli(t, b.env, "bridge", "append", e.stream, "Noted", e.data)
		require.NoError(t, err, out)
	}
	require.Eventually(t, func() bool {
		v, _ := metric(t, opsAddr, "jsbridge_bridge_streams_blocked")
		return v == 1
	}, 30*time.Second, 50*time.Millisecond, "blocked gauge never reached 1")
	wm, isBlocked, reason, ok := b.streamRow(t, "order-1")
	require.True(t, ok)
	require.True(t, isBlocked)
	require.EqualValues(t, 0, wm, "the event before the poison one is forwarded")
	require.Contains(t, reason, "event ", "the error names the event")
	require.Contains(t, reason, "(version 1,")
	require.Contains(t, p.output(), `"msg":"stream blocked"`)

	// Only order-1 is blocked: order-2 is forwarded whole, and nothing of
	// order-1 after the poison event is stored ahead of it.
	require.Eventually(t, func() bool {
		wm, blocked, _, ok := b.streamRow(t, "order-2")
		return ok && wm == 1 && !blocked
	}, 30*time.Second, 50*time.Millisecond)
	requireExactlyOnceInOrder(t, js, map[string]int64{"order-1": 0, "order-2": 1})
	errs, _ := metric(t, opsAddr, `jsbridge_bridge_publish_errors_total{class="too_large"}`)
	require.GreaterOrEqual(t, errs, 1.0)

	// The fix: the same server, same store, with a larger max payload.
	srvMu.Lock()
	srv.Shutdown()
	srv, err = embedded.Start(embedded.Config{Dir: dir, Port: natsPort, MaxPayload: 64 * 1024})
	if errors.Is(err, embedded.ErrPortInUse) {
		t.Logf("port %d taken while the server was down (%v): restarting on %d", natsPort, err, altPort)
		srv, err = embedded.Start(embedded.Config{Dir: dir, Port: altPort, MaxPayload: 64 * 1024})
	}
	srvMu.Unlock()
	require.NoError(t, err)
	waitHTTP200(t, "http://"+opsAddr+"/readyz")

	out, err = cli(t, b.env, "bridge", "unblock")
	require.Error(t, err, "unblock needs names, --match or --all")
	require.Contains(t, out, "--match")
	out, err = cli(t, b.env, "bridge", "unblock", "order-1", "order-2")
	require.NoError(t, err, out)
	require.Contains(t, out, "unblocked order-1 (was blocked")
	require.NotContains(t, out, "order-2", "a healthy stream is not changed")
	require.Eventually(t, func() bool {
		v, _ := metric(t, opsAddr, "jsbridge_bridge_streams_blocked")
		wm, _, _, _ := b.streamRow(t, "order-1")
		return v == 0 && wm == 2
	}, 60*time.Second, 100*time.Millisecond, "order-1 never resumed:\n%s", p.output())
	requireExactlyOnceInOrder(t, js, map[string]int64{"order-1": 2, "order-2": 1})

	out, err = cli(t, b.env, "bridge", "unblock", "--all")
	require.NoError(t, err, out)
	require.Contains(t, out, "nothing to unblock")

	// Reset asks first, then re-publishes; the duplicate window drops it all.
	out, err = cli(t, b.env, "bridge", "reset", "order-1")
	require.Error(t, err)
	require.Contains(t, out, "would reset order-1: watermark 2 -> -1")
	require.Contains(t, out, "--yes")
	wm, _, _, _ = b.streamRow(t, "order-1")
	require.EqualValues(t, 2, wm, "nothing changed without --yes")
	dupsBefore, _ := metric(t, opsAddr, "jsbridge_bridge_duplicates_total")
	out, err = cli(t, b.env, "bridge", "reset", "order-1", "--yes")
	require.NoError(t, err, out)
	require.Contains(t, out, "reset order-1: watermark 2 -> -1, 3 events to re-publish")
	require.Eventually(t, func() bool {
		dups, _ := metric(t, opsAddr, "jsbridge_bridge_duplicates_total")
		wm, _, _, _ := b.streamRow(t, "order-1")
		return wm == 2 && dups-dupsBefore == 3
	}, 30*time.Second, 100*time.Millisecond)
	requireExactlyOnceInOrder(t, js, map[string]int64{"order-1": 2, "order-2": 1})
}

// appTable is an events table of the common layout as another program
// creates it, in its own schema, with no trigger.
const opsAppTable = `CREATE TABLE %s.events (
    id      bigserial   PRIMARY KEY,
    stream  text        NOT NULL,
    version bigint      NOT NULL,
    name    text        NOT NULL,
    data    jsonb       NOT NULL,
    meta    jsonb       NOT NULL DEFAULT '{}',
    created timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, version)
)`

// A table another program writes, in its own schema: `bridge migrate
// --events-table` leaves it untouched, and `bridge run --events-table`
// drains it completely and in order while its writers commit out of id
// order and roll some inserts back.
func TestBridgeOpsExternalEventsTable(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	ctx := context.Background()
	app := jsbridgetest.Schema(t, b.pool)
	_, err := b.pool.Exec(ctx, strings.ReplaceAll(opsAppTable, "%s", app))
	require.NoError(t, err)
	table := app + ".events"
	env := append(b.env, "JSBRIDGE_EVENTS_TABLE="+table)

	// The "other program" has events before the bridge arrives.
	_, err = b.pool.Exec(ctx, "INSERT INTO "+table+` (stream, version, name, data)
SELECT 'old-' || (g % 5), g / 5, 'Happened', '{}' FROM generate_series(0, 49) g ORDER BY g`)
	require.NoError(t, err)
	before := jsbridgetest.SchemaShape(t, b.pool, app)

	out, err := cli(t, env, "bridge", "migrate", "--dry-run")
	require.NoError(t, err, out)
	require.NotContains(t, out, app, "the dry run touches nothing of the app's")
	require.NotContains(t, out, "TRIGGER")
	out, err = cli(t, env, "bridge", "migrate")
	require.NoError(t, err, out)
	require.Contains(t, out, "events table "+table+": layout checked, left unchanged")
	require.Contains(t, out, "applied 4 migrations")
	require.Contains(t, out, "004_oldest_first.sql: column "+b.schema+".streams.pending_since, index streams_due_idx\n", "nothing of 004 that touches the own events table")
	require.Contains(t, out, "005_live_appends.sql: column "+b.schema+".streams.pending, index streams_claimable_idx\n", "nothing of 005 that touches the own events table")
	require.NotContains(t, out, "002_events.sql")
	require.Equal(t, before, jsbridgetest.SchemaShape(t, b.pool, app), "migrate changed the app's schema")

	srv, js := testJetStream(t)
	startBridgeProc(t, env, "--nats-url", srv.ClientURL(), "--ops-addr", "", "--poll-interval", "50ms")

	// Writers commit after a random pause, so ids commit out of order; one
	// insert in five is rolled back (a gap in the ids) and written again.
	const writers, streamsPer, perStream = 6, 5, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for s := range streamsPer {
				stream := fmt.Sprintf("acct-%d", w*streamsPer+s)
				for v := 0; v < perStream; {
					tx, err := b.pool.Begin(ctx)
					if err != nil {
						t.Errorf("begin: %v", err)
						return
					}
					_, err = tx.Exec(ctx, "INSERT INTO "+table+" (stream, version, name, data) VALUES ($1, $2, 'Deposited', $3)",
						stream, v, fmt.Sprintf(`{"v":%d}`, v))
					if err != nil {
						_ = tx.Rollback(ctx)
						t.Errorf("insert: %v", err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond)
					if rand.IntN(5) == 0 {
						_ = tx.Rollback(ctx)
						continue
					}
					if err := tx.Commit(ctx); err != nil {
						t.Errorf("commit: %v", err)
						return
					}
					v++
				}
			}
		})
	}
	wg.Wait()

	heads := map[string]int64{}
	for s := range 5 {
		heads[fmt.Sprintf("old-%d", s)] = 9
	}
	for s := range writers * streamsPer {
		heads[fmt.Sprintf("acct-%d", s)] = perStream - 1
	}
	total := uint64(50 + writers*streamsPer*perStream)
	require.Eventually(t, func() bool { return jsMessages(js) >= total }, 60*time.Second, 100*time.Millisecond,
		"JetStream holds %d of %d events", jsMessages(js), total)
	requireExactlyOnceInOrder(t, js, heads)
	require.Equal(t, before, jsbridgetest.SchemaShape(t, b.pool, app), "running the bridge changed the app's schema")
}
