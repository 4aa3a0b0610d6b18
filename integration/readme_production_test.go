package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// productionBlocks returns the fenced code blocks of docs/operations.md's
// "## Production" section (up to its first "### " subsection), by
// language: what the section shows a user to copy.
func productionBlocks(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	sec := string(raw)
	i := strings.Index(sec, "\n## Production\n")
	require.GreaterOrEqual(t, i, 0, "docs/operations.md has a Production section")
	sec = sec[i+1:]
	sec = sec[:strings.Index(sec, "\n### ")]
	blocks := map[string]string{}
	for {
		start := strings.Index(sec, "\n```")
		if start < 0 {
			break
		}
		sec = sec[start+4:]
		lang, body, ok := strings.Cut(sec, "\n")
		require.True(t, ok)
		end := strings.Index(body, "\n```")
		require.GreaterOrEqual(t, end, 0, "unterminated %s block", lang)
		require.NotContains(t, blocks, lang, "one %s block", lang)
		blocks[lang] = body[:end+1]
		sec = body[end+4:]
	}
	require.Contains(t, blocks, "conf", "the server configuration")
	require.Contains(t, blocks, "sh", "the production commands")
	return blocks
}

// readmeCluster starts three NATS servers from the README's server
// configuration, as the README says to run them: the same file with its
// own server_name each. Only what ties it to the README's machines changes:
// host names and ports become loopback and free ports, and the store a
// temporary directory. It checks first that the file says what the
// README's text promises (sync_interval always, the cluster, the users).
func readmeCluster(t *testing.T, conf string, passwords map[string]string) string {
	t.Helper()
	// The configuration's $BRIDGE_PASSWORD and $CONSUMER_PASSWORD come
	// from the environment in production; defined as variables of the file
	// here (the server looks there first), as a parallel test cannot set
	// its process's environment.
	var vars strings.Builder
	for k, v := range passwords {
		fmt.Fprintf(&vars, "%s: %q\n", k, v)
	}
	path := filepath.Join(t.TempDir(), "nats-server.conf")
	require.NoError(t, os.WriteFile(path, []byte(vars.String()+conf), 0o600))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, "the README's server configuration:\n%s", conf)
	require.True(t, opts.JetStream, "JetStream on")
	require.True(t, opts.SyncAlways, "sync_interval: always")
	require.Equal(t, "/var/lib/nats", opts.StoreDir)
	require.Equal(t, "nats-1", opts.ServerName)
	require.Equal(t, 4222, opts.Port)
	require.Equal(t, "prod", opts.Cluster.Name)
	require.Equal(t, 6222, opts.Cluster.Port)
	require.Len(t, opts.Routes, 3)
	users := map[string]string{}
	for _, u := range opts.Users {
		users[u.Username] = u.Password
	}
	require.Equal(t, map[string]string{"bridge": passwords["BRIDGE_PASSWORD"], "consumer": passwords["CONSUMER_PASSWORD"]}, users)

	// Ports the servers choose themselves (-1), not ones picked before
	// and taken meanwhile by another test's process (nats-2 was once not
	// ready in 30 s): nats-1 is the seed, on a route port picked just
	// before it starts (a JetStream cluster needs a configured route: its
	// own, which it ignores); the others route to it and learn each other
	// from it.
	const nodes = 3
	dir := t.TempDir()
	urls := make([]string, nodes)
	var seed string
	for i := range nodes {
		o, err := server.ProcessConfigFile(path) // NewServer changes its Options: one each
		require.NoError(t, err)
		o.ServerName = fmt.Sprintf("nats-%d", i+1)
		o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", server.RANDOM_PORT
		if i == 0 {
			o.Cluster.Port = freePort(t)
			seed = fmt.Sprintf("nats-route://127.0.0.1:%d", o.Cluster.Port)
		}
		o.Routes = server.RoutesFromStr(seed)
		o.StoreDir = filepath.Join(dir, o.ServerName)
		o.NoSigs, o.NoLog = true, true
		srv, err := server.NewServer(o)
		require.NoError(t, err)
		go srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		require.True(t, srv.ReadyForConnections(30*time.Second), "%s ready", o.ServerName)
		urls[i] = srv.ClientURL()
	}
	natsURL := strings.Join(urls, ",")
	nc, err := nats.Connect(natsURL, nats.UserInfo("bridge", passwords["BRIDGE_PASSWORD"]))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the cluster elects a meta leader")
	return natsURL
}

// TestREADMEProductionRuns runs docs/operations.md's Production section: three
// servers from its configuration, then its commands, each as written plus
// an ops address (and the test's schema, users and subscription file). The
// bridge is given a Postgres URL with a host that is down before the real
// one, as after a failover; it creates the EVENTS stream R3, the consumer
// the DLQ stream and its lease and positions buckets R3, an event reaches the
// receiver, and verify completes a clean round.
func TestREADMEProductionRuns(t *testing.T) {
	t.Parallel()
	blocks := productionBlocks(t)
	passwords := map[string]string{"BRIDGE_PASSWORD": "b-" + strconv.FormatInt(time.Now().UnixNano(), 36), "CONSUMER_PASSWORD": "c-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	natsURL := readmeCluster(t, blocks["conf"], passwords)

	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	// The test's Postgres behind a host that is down: the first of the URL.
	pgURL, err := url.Parse(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	pgURL.Host = fmt.Sprintf("127.0.0.1:%d,%s", freePort(t), pgURL.Host)
	q := pgURL.Query()
	q.Set("target_session_attrs", "read-write")
	pgURL.RawQuery = q.Encode()

	rc, rsrv := newRecorder(t)
	subs := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(subs, fmt.Appendf(nil, `subscriptions:
  - name: orders
    filter_subjects: [events.>]
    url: %s
    secrets_env: [ORDERS_SECRET]
    allow_private: true
    start: all
`, rsrv.URL), 0o600))

	env := []string{"JSBRIDGE_SCHEMA=" + schema, "ORDERS_SECRET=" + testSecret}
	var ops []string // the processes' ops addresses
	var procs []*proc
	for _, line := range strings.Split(blocks["sh"], "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if kv, ok := strings.CutPrefix(line, "export "); ok {
			name, value, ok := strings.Cut(kv, "=")
			require.True(t, ok, line)
			value = strings.Trim(value, `'"`)
			switch name {
			case "DATABASE_URL":
				cfg, err := pgxpool.ParseConfig(value)
				require.NoError(t, err, "the README's DATABASE_URL")
				require.Len(t, cfg.ConnConfig.Fallbacks, 1, "the README's DATABASE_URL names two hosts")
				require.Equal(t, "read-write", valueOf(value, "target_session_attrs"))
				require.NotNil(t, cfg.ConnConfig.ValidateConnect, "pgx checks each host for read-write")
				env = append(env, "DATABASE_URL="+pgURL.String())
			case "NATS_URL":
				require.Len(t, strings.Split(value, ","), 3, "the README's NATS_URL names three servers")
				env = append(env, "NATS_URL="+natsURL)
			default:
				t.Fatalf("the README's commands export %s, which this test does not know", name)
			}
			continue
		}
		args := strings.Fields(line)
		for i, a := range args {
			if a == "subscriptions.yaml" {
				args[i] = subs
			}
		}
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		user := args[0] // the bridge's user for bridge run and verify
		procEnv := append(append([]string{}, env...), "NATS_USER="+user, "NATS_PASSWORD="+passwords[strings.ToUpper(user)+"_PASSWORD"])
		p := startProc(t, procEnv, args[0], append(args[1:], "--ops-addr", addr)...)
		procs = append(procs, p)
		ops = append(ops, addr)
		// One after the other, as a deployment would: verify's first
		// round needs the bridge's stream (a round that fails is tried
		// again an --interval later).
		require.Eventually(t, func() bool { code, _ := getBody("http://" + addr + "/readyz"); return code == 200 },
			30*time.Second, 50*time.Millisecond, "%s becomes ready; output:\n%s", line, p.out)
	}
	require.Len(t, ops, 3, "bridge run, consumer run, bridge verify")

	nc, err := nats.Connect(natsURL, nats.UserInfo("bridge", passwords["BRIDGE_PASSWORD"]))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	// The subscription is ordered (the default): the lease and positions
	// buckets are R3 too.
	names := []string{wire.DefaultEventsStream, "DLQ", "KV_" + wire.DefaultLeaseBucket, "KV_" + position.DefaultBucket}
	for _, name := range names {
		var s jetstream.Stream
		require.Eventually(t, func() bool { s, err = js.Stream(t.Context(), name); return err == nil }, 30*time.Second, 50*time.Millisecond, "stream %s", name)
		require.Equal(t, 3, s.CachedInfo().Config.Replicas, "%s is R3", name)
	}

	out, err := cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond, "the event reaches the receiver")

	// verify's rounds (every 5 minutes) began when it started: the first
	// one, clean, saw no event yet or this one.
	verifyAddr := ops[2]
	require.Eventually(t, func() bool {
		clean, _ := metric(t, verifyAddr, `jsbridge_bridge_audit_rounds_total{result="clean"}`)
		return clean >= 1
	}, 30*time.Second, 50*time.Millisecond, "verify completed a clean round; output:\n%s", procs[2].out)
	missing, ok := metric(t, verifyAddr, "jsbridge_bridge_audit_missing")
	require.True(t, ok)
	require.Zero(t, missing)
}

// valueOf returns the query parameter name of a URL that may name several
// hosts (url.Parse takes them as one), "" when absent.
func valueOf(rawURL, name string) string {
	_, query, _ := strings.Cut(rawURL, "?")
	v, _ := url.ParseQuery(query)
	return v.Get(name)
}
