package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// permissionsConf returns the server configuration block of
// docs/operations.md's "Least privilege" section: the users and their
// permissions, as a user copies them.
func permissionsConf(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	sec := string(raw)
	i := strings.Index(sec, "\n### Least privilege")
	require.GreaterOrEqual(t, i, 0, "docs/operations.md has a Least privilege section")
	sec = sec[i:]
	start := strings.Index(sec, "\n```conf\n")
	require.GreaterOrEqual(t, start, 0, "the section's conf block")
	body := sec[start+len("\n```conf\n"):]
	end := strings.Index(body, "\n```")
	require.GreaterOrEqual(t, end, 0)
	return body[:end+1]
}

var permissionsPasswords = map[string]string{"BRIDGE_PASSWORD": "bridge-pw-0137", "CONSUMER_PASSWORD": "consumer-pw-0137", "OPS_PASSWORD": "ops-pw-0137"}

// startPermissionsServer starts an embedded NATS server with JetStream
// whose users and permissions are conf (with edit applied to it), on a
// free loopback port, and returns its URL.
func startPermissionsServer(t *testing.T, conf string) string {
	t.Helper()
	var vars strings.Builder
	for k, v := range permissionsPasswords {
		fmt.Fprintf(&vars, "%s: %q\n", k, v)
	}
	path := filepath.Join(t.TempDir(), "nats-server.conf")
	full := fmt.Sprintf("%slisten: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n%s", vars.String(), freePort(t), t.TempDir(), conf)
	require.NoError(t, os.WriteFile(path, []byte(full), 0o600))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, "the documented permissions:\n%s", conf)
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(30*time.Second))
	return srv.ClientURL()
}

func as(user string) []string {
	return []string{"NATS_USER=" + user, "NATS_PASSWORD=" + permissionsPasswords[strings.ToUpper(user)+"_PASSWORD"]}
}

// The bridge, the consumer and an operator's commands, each as its own
// user with exactly the permissions docs/operations.md gives it, deliver a
// webhook end to end (an ordered subscription: the copy, the partition
// leases and the parked bucket) and run the day-2 commands, with no
// permission refused.
func TestLeastPrivilegePermissionsDeliverEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS server, the bridge and the consumer")
	}
	t.Parallel()
	url := startPermissionsServer(t, permissionsConf(t))
	pool := jsbridgetest.Pool(t)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + jsbridgetest.Schema(t, pool), "NATS_URL=" + url}
	rc, rsrv := newRecorder(t)
	bridgeOps, consumerOps := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	bridge := daemon(t, append(env, as("bridge")...), "bridge", "run", "--ops-addr", bridgeOps)
	waitHTTP200(t, "http://"+bridgeOps+"/readyz")
	consumer := startProc(t, append(env, append(as("consumer"), "JSBRIDGE_SECRET="+testSecret)...), "consumer", "run", "--start", "all",
		"--name", "least", "--url", rsrv.URL, "--allow-private", "--ops-addr", consumerOps)
	waitHTTP200(t, "http://"+consumerOps+"/readyz")

	// A subscription kept in the bucket: added by the operator, read and
	// watched by a consumer as the consumer user.
	ops := append(env, as("ops")...)
	dir := t.TempDir()
	keyFile, secretFile := filepath.Join(dir, "keys"), filepath.Join(dir, "secret")
	keygen, err := cli(t, ops, "consumer", "subscriptions", "keygen")
	require.NoError(t, err, keygen)
	var key string
	for _, line := range strings.Split(keygen, "\n") { // the key line, not the hint
		if line != "" && !strings.ContainsAny(line, " #") {
			key = line
		}
	}
	require.NotEmpty(t, key, keygen)
	require.NoError(t, os.WriteFile(keyFile, []byte(key+"\n"), 0o600))
	require.NoError(t, os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600))
	kc, ksrv := newRecorder(t)
	out, err := cli(t, ops, "consumer", "subscriptions", "add", "fromkv", "--url", ksrv.URL, "--filter", "events.>", "--secret-file", secretFile,
		"--allow-private", "--secrets-key-file", keyFile)
	require.NoError(t, err, out)
	kvOps := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	kvConsumer := &syncBuffer{}
	startKV := func() {
		kvConsumer = daemon(t, append(env, as("consumer")...), "consumer", "run", "--subscriptions-from", "kv", "--secrets-key-file", keyFile,
			"--ops-addr", kvOps)
		waitHTTP200(t, "http://"+kvOps+"/readyz")
	}

	out, err = cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
	require.NoError(t, err, out)
	// The replicas share the partitions, so every replica runs the same
	// subscriptions: the consumer of the flags delivers and stops before
	// the one of the bucket runs (its subscription, added before the
	// event, starts before it).
	require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond,
		"the event never reached the flags' endpoint; consumer:\n%s", consumer.out)
	require.NoError(t, consumer.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-consumer.exited:
		require.NoError(t, consumer.err, "consumer after SIGTERM:\n%s", consumer.out)
	case <-time.After(20 * time.Second):
		t.Fatalf("consumer did not exit within 20 s of SIGTERM:\n%s", consumer.out)
	}
	startKV()
	require.Eventually(t, func() bool { return rc.count() == 1 && kc.count() == 1 }, 30*time.Second, 50*time.Millisecond,
		"the event never reached both endpoints; bridge:\n%s\nconsumer:\n%s\nkv consumer:\n%s", bridge, consumer.out, kvConsumer)

	for _, args := range [][]string{
		{"bridge", "verify"},
		{"bridge", "retention"},
		{"consumer", "dlq", "list"},
		{"consumer", "status"},
		{"consumer", "trace", "1"},
	} {
		out, err := cli(t, ops, args[0], args[1:]...)
		require.NoError(t, err, "%s as ops: %s", strings.Join(args, " "), out)
	}
	for who, out := range map[string]*syncBuffer{"bridge": bridge, "consumer": consumer.out, "kv consumer": kvConsumer} {
		require.NotContains(t, out.String(), "Permissions Violation", "%s was refused a subject:\n%s", who, out)
	}
}

// A permission taken away from the documented set: the process says, in
// its log or its exit, which subject was refused.
func TestLeastPrivilegeMissingPermissionIsNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers, the bridge and the consumer")
	}
	t.Parallel()
	conf := permissionsConf(t)
	for _, tc := range []struct {
		name, remove string
		run          func(t *testing.T, env []string) string
		want         string
	}{
		{"bridge publish", `"events.>",`, func(t *testing.T, env []string) string {
			out, err := cli(t, env, "bridge", "migrate")
			require.NoError(t, err, out)
			p := startUntil(t, append(env, as("bridge")...), "Permissions Violation", "bridge", "run", "--ops-addr", "")
			out, err = cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{}`)
			require.NoError(t, err, out)
			return p()
		}, `Permissions Violation for Publish to \"events.order.order-1.OrderPlaced\"`},
		{"consumer stream lookup", `"$JS.API.STREAM.*.DLQ", `, func(t *testing.T, env []string) string {
			// consumer run waits for the DLQ stream (a server starting
			// up), saying at each try which subject was refused.
			return startUntil(t, append(env, append(as("consumer"), "JSBRIDGE_SECRET="+testSecret)...), "Permissions Violation", "consumer", "run",
				"--name", "least", "--url", "http://127.0.0.1:9/hook", "--allow-private", "--ops-addr", "")()
		}, `Permissions Violation for Publish to \"$JS.API.STREAM.INFO.DLQ\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, conf, tc.remove)
			url := startPermissionsServer(t, strings.Replace(conf, tc.remove, "", 1))
			pool := jsbridgetest.Pool(t)
			env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + jsbridgetest.Schema(t, pool), "NATS_URL=" + url}
			began := time.Now()
			out := tc.run(t, env)
			t.Logf("named after %v:\n%s", time.Since(began).Round(time.Millisecond), out)
			require.Contains(t, out, tc.want, "the refused subject is named")
		})
	}
}

// startUntil starts bin with args and returns a func that waits until its
// output contains want, kills it and returns the output.
func startUntil(t *testing.T, env []string, want, bin string, args ...string) func() string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binaries(t), bin), args...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-done
	}
	t.Cleanup(stop)
	return func() string {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Contains(out.String(), want) }, 30*time.Second, 50*time.Millisecond,
			"%s never said %q; output:\n%s", bin, want, out)
		stop()
		return out.String()
	}
}
