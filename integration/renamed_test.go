package integration

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// helpEntry is the start of one flag's entry in --help (indented a few
// spaces; wrapped help lines are indented far more): its name and what
// kong shows after "=" (the default, or a placeholder such as STRING).
var helpEntry = regexp.MustCompile(`(?m)^ {2,8}(?:-[a-z], )?--(?:\[no-\])?([a-z0-9-]+)(?:=(\S+))?`)

// helpEnvs maps each environment variable a command's --help shows to
// "--flag=default" of the flag reading it.
func helpEnvs(t *testing.T, bin string, args ...string) map[string]string {
	t.Helper()
	out, err := cli(t, nil, bin, append(args, "--help")...)
	require.NoError(t, err, out)
	envs := map[string]string{}
	idx := helpEntry.FindAllStringSubmatchIndex(out, -1)
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		flag := "--" + out[m[2]:m[3]]
		if m[4] >= 0 {
			flag += "=" + out[m[4]:m[5]]
		}
		block := strings.Join(strings.Fields(out[m[0]:end]), " ")
		for _, e := range helpEnv.FindAllStringSubmatch(block, -1) {
			envs[e[1]] = flag
		}
	}
	return envs
}

// One environment file for both binaries (the usual compose or Kubernetes
// habit) must not set one of them wrong: a variable both `run`s read is
// read by the same flag with the same default. Where they differ the
// names are per binary (JSBRIDGE_BRIDGE_OPS_ADDR, JSBRIDGE_CONSUMER_OPS_ADDR).
func TestSharedEnvironmentVariablesMeanTheSame(t *testing.T) {
	t.Parallel()
	bridge, consumer := helpEnvs(t, "bridge", "run"), helpEnvs(t, "consumer", "run")
	require.Equal(t, "--ops-addr=\"127.0.0.1:9464\"", bridge["JSBRIDGE_BRIDGE_OPS_ADDR"], "the parse of --help found the bridge's ops port")
	shared := 0
	for env, b := range bridge {
		c, ok := consumer[env]
		if !ok {
			continue
		}
		shared++
		require.Equal(t, b, c, "$%s: bridge run reads it as %s, consumer run as %s", env, b, c)
	}
	require.Greater(t, shared, 5, "NATS_URL, JSBRIDGE_STREAM, the log and NATS settings are shared")
	for _, old := range []string{"JSBRIDGE_REPLICAS", "JSBRIDGE_OPS_ADDR", "JSBRIDGE_MAX_IN_FLIGHT"} {
		require.NotContains(t, bridge, old)
		require.NotContains(t, consumer, old)
	}
}

// The old names are still accepted, with a warning naming the new ones:
// --replicas 0 or JSBRIDGE_REPLICAS=0 is refused as --stream-replicas.
func TestRenamedFlagsWarnAndStillApply(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"bridge", "consumer"} {
		args := []string{"run", "--nats-url", "nats://127.0.0.1:1", "--database-url", "postgres://x@127.0.0.1:1/x"}
		if bin == "consumer" {
			args = []string{"run", "--nats-url", "nats://127.0.0.1:1", "--url", "https://example.com/hook"}
		}
		out, err := cli(t, nil, bin, append(args, "--replicas", "0")...)
		require.Error(t, err, out)
		require.Contains(t, out, bin+": warning: --replicas is deprecated and will be removed in the next release: use --stream-replicas (JSBRIDGE_STREAM_REPLICAS)")
		require.Contains(t, out, "--stream-replicas (JSBRIDGE_STREAM_REPLICAS) 0: want 1 or more")

		out, err = cli(t, []string{"JSBRIDGE_REPLICAS=0"}, bin, args...)
		require.Error(t, err, out)
		require.Contains(t, out, bin+": warning: JSBRIDGE_REPLICAS is deprecated and will be removed in the next release: use JSBRIDGE_STREAM_REPLICAS")
		require.Contains(t, out, "--stream-replicas (JSBRIDGE_STREAM_REPLICAS) 0: want 1 or more")
	}
}
