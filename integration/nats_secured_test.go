package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/natsconn/natsconntest"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// securedRun starts bridge run and consumer run against url with the
// connection flags conn (and env), appends one event and waits until the
// consumer's endpoint received it: both binaries connected, the bridge
// forwarded, the consumer delivered. It returns the processes' output.
func securedRun(t *testing.T, env []string, conn ...string) []*syncBuffer {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	env = append([]string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema, "NATS_URL="}, env...)
	rc, rsrv := newRecorder(t)
	bridgeOps, consumerOps := freePort(t), freePort(t)

	bridge := daemon(t, env, "bridge", append([]string{"run", "--ops-addr", fmt.Sprintf("127.0.0.1:%d", bridgeOps)}, conn...)...)
	waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", bridgeOps))
	consumer := daemon(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", append([]string{"run", "--start", "all",
		"--name", "secured", "--url", rsrv.URL, "--allow-private", "--filter", "events.>",
		"--ops-addr", fmt.Sprintf("127.0.0.1:%d", consumerOps)}, conn...)...)
	waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", consumerOps))

	out, err := cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond,
		"the event never reached the endpoint; bridge:\n%s\nconsumer:\n%s", bridge, consumer)
	return []*syncBuffer{bridge, consumer}
}

func requireNoSecret(t *testing.T, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		require.NotContains(t, out, s, "a secret appeared in the output")
	}
}

func TestSecuredNATS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind    string
		start   func(testing.TB) natsconntest.Secured
		refused string // what the refusal message names
	}{
		{"user-password", natsconntest.StartUserPassword, "Authorization Violation"},
		{"nkey", natsconntest.StartNKey, "Authorization Violation"},
		{"creds", natsconntest.StartCreds, "Authorization Violation"},
		{"tls", natsconntest.StartTLS, "tls"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			srv := tc.start(t)
			good := append([]string{"--nats-url", srv.URL}, natsconntest.Args(srv.Good)...)
			for _, out := range securedRun(t, nil, good...) {
				requireNoSecret(t, out.String(), srv.Secrets)
			}

			// Refused: each exits non-zero at once, saying the server
			// refused it, and prints no secret.
			bad := append([]string{"--nats-url", srv.URL}, natsconntest.Args(srv.Bad)...)
			env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + jsbridgetest.Schema(t, jsbridgetest.Pool(t))}
			for _, args := range [][]string{
				append([]string{"bridge", "run", "--ops-addr", ""}, bad...),
				append([]string{"consumer", "run", "--ops-addr", "", "--name", "secured", "--url", "http://127.0.0.1:1",
					"--allow-private", "--filter", "events.>"}, bad...),
				append([]string{"consumer", "dlq", "list"}, bad...),
			} {
				out, err := cli(t, append(env, "JSBRIDGE_SECRET="+testSecret), args[0], args[1:]...)
				require.Error(t, err, "%v must fail with refused credentials; output:\n%s", args[:2], out)
				require.Contains(t, out, tc.refused, "%v", args[:2])
				if args[1] == "run" {
					require.Contains(t, out, "the server refused this client", "%v", args[:2])
				}
				requireNoSecret(t, out, srv.Secrets)
			}
		})
	}
}

// TestSecuredNATSContext: a user whose nats CLI context is saved types
// --context NAME and nothing else; the context is found under
// $HOME/.config without XDG_CONFIG_HOME and under $XDG_CONFIG_HOME.
func TestSecuredNATSContext(t *testing.T) {
	t.Parallel()
	srv := natsconntest.StartUserPassword(t)
	body := fmt.Sprintf(`{"description": "test", "url": %q, "user": %q, "password": %q}`, srv.URL, srv.Good.User, srv.Good.Password)
	home := t.TempDir()
	dir := filepath.Join(home, ".config", "nats", "context")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prod.json"), []byte(body), 0o600))

	outs := securedRun(t, []string{"HOME=" + home, "XDG_CONFIG_HOME="}, "--context", "prod")
	for _, out := range outs {
		requireNoSecret(t, out.String(), srv.Secrets)
	}

	// XDG_CONFIG_HOME, and NATS_CONTEXT as the nats CLI reads it.
	xdg := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(xdg, "nats", "context"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(xdg, "nats", "context", "xdg.json"), []byte(body), 0o600))
	out, err := cli(t, []string{"NATS_URL=", "XDG_CONFIG_HOME=" + xdg, "NATS_CONTEXT=xdg"}, "consumer", "dlq", "list")
	require.NoError(t, err, out)

	// An unknown context names the file looked for.
	out, err = cli(t, []string{"NATS_URL=", "XDG_CONFIG_HOME=" + xdg}, "consumer", "dlq", "list", "--context", "nope")
	require.Error(t, err)
	require.Contains(t, out, filepath.Join(xdg, "nats", "context", "nope.json"))
}

func TestSecuredNATSFlagErrorsAtStart(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + jsbridgetest.Schema(t, jsbridgetest.Pool(t))}
	missing := filepath.Join(t.TempDir(), "app.creds")

	out, err := cli(t, env, "bridge", "run", "--ops-addr", "", "--nats-url", "nats://127.0.0.1:1", "--nats-creds", missing)
	require.Error(t, err)
	require.Contains(t, out, "--nats-creds")
	require.Contains(t, out, missing)

	out, err = cli(t, env, "consumer", "run", "--ops-addr", "", "--name", "x", "--url", "http://127.0.0.1:1", "--allow-private",
		"--nats-tls-cert", missing)
	require.Error(t, err)
	require.Contains(t, out, "--nats-tls-cert")
	require.Contains(t, out, "--nats-tls-key")

	// The embedded server has no authentication: asking for some is an
	// error, not silently ignored.
	out, err = cli(t, append(env, "NATS_PASSWORD=hunter2-secret"), "bridge", "run", "--ops-addr", "", "--embedded-nats", "--embedded-nats-port=-1",
		"--embedded-nats-dir", t.TempDir(), "--nats-user", "app")
	require.Error(t, err)
	require.Contains(t, out, "--embedded-nats")
	require.Contains(t, out, "--nats-user, --nats-password")
	require.NotContains(t, out, "hunter2")
	require.False(t, strings.Contains(out, "bridge started"))
}
