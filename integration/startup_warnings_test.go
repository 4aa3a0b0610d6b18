package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// Settings that silently give up durability are named at start-up by the
// binaries that meet them, on a server that is not the bridge's embedded
// one: one replica on a cluster (bridge and consumer), a stream kept in
// memory (the bridge for the events stream, the consumer for the events
// and the dead-letter streams), a duplicate window shorter than the
// bridge's worst case (the flag, and the existing stream's). Both still
// run: a warning, not a refusal.
func TestStartupWarnsWhereDurabilityIsGivenUp(t *testing.T) {
	t.Parallel()
	cluster := jsbridgetest.StartCluster(t, embedded.ClusterConfig{})
	_, js := jsbridgetest.ConnectCluster(t, cluster)
	for _, s := range []jetstream.StreamConfig{
		// AllowDirect as the bridge creates it: the shared engine
		// refuses a stream without it at start (its reads are direct
		// gets), and that refusal is not what this test is about.
		{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.MemoryStorage, Duplicates: 10 * time.Second, AllowDirect: true},
		{Name: "DLQ", Subjects: []string{"dlq.>"}, Storage: jetstream.MemoryStorage},
	} {
		_, err := js.CreateStream(t.Context(), s)
		require.NoError(t, err)
	}
	pool := jsbridgetest.Pool(t)
	env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + jsbridgetest.Schema(t, pool), "NATS_URL=" + cluster.ClientURLs()}
	bridgeOps, consumerOps := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	bridge := daemon(t, env, "bridge", "run", "--ops-addr", bridgeOps, "--lease", "30s", "--duplicate-window", "20s")
	consumer := daemon(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", "run", "--ops-addr", consumerOps,
		"--name", "warned", "--url", "http://127.0.0.1:9/hook", "--allow-private")
	waitReadyz(t, bridgeOps, 200, "ready")
	waitReadyz(t, consumerOps, 200, "ready")

	cases := []struct {
		who  string
		out  *syncBuffer
		want []string
	}{
		{"bridge", bridge, []string{
			`--stream-replicas 1 on JetStream cluster \"jsbridge\"`,
			"JetStream stream EVENTS uses memory storage",
			"--duplicate-window is shorter than --lease plus --publish-timeout",
			"JetStream stream EVENTS has duplicate window 10s, shorter than the configured 20s",
		}},
		{"consumer", consumer, []string{
			`--stream-replicas 1 on JetStream cluster \"jsbridge\"`,
			"JetStream stream EVENTS uses memory storage: its events not delivered yet are lost when the NATS server restarts",
			"JetStream stream DLQ uses memory storage: its dead letters are lost when the NATS server restarts",
		}},
	}
	for _, c := range cases {
		for _, w := range c.want {
			require.Eventually(t, func() bool { return strings.Contains(c.out.String(), w) }, 10*time.Second, 20*time.Millisecond,
				"%s warns %q; output:\n%s", c.who, w, c.out)
		}
	}
	// Each warning is a warning: logged at level WARN, once.
	for _, c := range cases {
		for _, line := range strings.Split(c.out.String(), "\n") {
			for _, w := range c.want {
				if strings.Contains(line, w) {
					require.Contains(t, line, "level=WARN", "%s: %s", c.who, line)
				}
			}
		}
		require.Equal(t, 1, strings.Count(c.out.String(), c.want[0]), "%s warns about replicas once", c.who)
	}
}
