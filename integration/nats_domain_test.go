package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// startDomainServer starts an in-process nats-server named name with
// JetStream in domain, and a leafnode listener on leafPort (the hub) or a
// leafnode connection to hubLeaf (the leaf). It is shut down at cleanup.
func startDomainServer(t *testing.T, name, domain string, leafPort int, hubLeaf *url.URL) *server.Server {
	t.Helper()
	opts := &server.Options{
		ServerName: name, Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		JetStream: true, JetStreamDomain: domain, StoreDir: t.TempDir(),
	}
	if hubLeaf == nil {
		opts.LeafNode = server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort}
	} else {
		opts.LeafNode = server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{hubLeaf}}}}
	}
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second), "server %s ready", name)
	t.Cleanup(srv.Shutdown)
	return srv
}

// A hub and a leaf node, each with its own JetStream domain: a bridge and
// a consumer connected to one server use the other's JetStream through
// the domain (--js-domain, or a nats context's jetstream_domain), and an
// event appended to Postgres reaches the endpoint; consumer status and
// bridge verify read through the domain too.
func TestBridgeAndConsumerThroughALeafnodeDomain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS servers and both binaries")
	}
	t.Parallel()
	for _, tc := range []struct {
		name string
		// conn returns the connection flags given the hub and the leaf,
		// and the domain whose JetStream they reach.
		conn func(t *testing.T, hub, leaf *server.Server) ([]string, string)
	}{
		{"flag on the hub to the leaf's domain", func(t *testing.T, hub, _ *server.Server) ([]string, string) {
			return []string{"--nats-url", hub.ClientURL(), "--js-domain", "leaf"}, "leaf"
		}},
		{"context on the leaf to the hub's domain", func(t *testing.T, _, leaf *server.Server) ([]string, string) {
			path := filepath.Join(t.TempDir(), "hub.json")
			require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `{"url": %q, "jetstream_domain": "hub"}`, leaf.ClientURL()), 0o600))
			return []string{"--context", path}, "hub"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leafPort := freePort(t)
			hub := startDomainServer(t, "hub", "hub", leafPort, nil)
			hubLeaf, err := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", leafPort))
			require.NoError(t, err)
			leaf := startDomainServer(t, "leaf", "leaf", 0, hubLeaf)
			require.Eventually(t, func() bool { return hub.NumLeafNodes() == 1 && leaf.NumLeafNodes() == 1 },
				10*time.Second, 20*time.Millisecond, "the leaf node connected to the hub")
			conn, domain := tc.conn(t, hub, leaf)

			pool := jsbridgetest.Pool(t)
			schema := jsbridgetest.Schema(t, pool)
			env := []string{"DATABASE_URL=" + jsbridgetest.DatabaseURL(t), "JSBRIDGE_SCHEMA=" + schema, "NATS_URL=", "NATS_CONTEXT="}
			rc, rsrv := newRecorder(t)
			bridgeOps, consumerOps := freePort(t), freePort(t)
			bridge := daemon(t, env, "bridge", append([]string{"run", "--ops-addr", fmt.Sprintf("127.0.0.1:%d", bridgeOps)}, conn...)...)
			waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", bridgeOps))
			consumer := daemon(t, append(env, "JSBRIDGE_SECRET="+testSecret), "consumer", append([]string{"run", "--start", "all",
				"--name", "domained", "--url", rsrv.URL, "--allow-private", "--filter", "events.>", "--ordering", "none",
				"--ops-addr", fmt.Sprintf("127.0.0.1:%d", consumerOps)}, conn...)...)
			waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", consumerOps))

			out, err := cli(t, env, "bridge", "append", "order-1", "OrderPlaced", `{"total": 42}`)
			require.NoError(t, err, out)
			require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond,
				"the event never reached the endpoint; bridge:\n%s\nconsumer:\n%s", bridge, consumer)
			require.Contains(t, bridge.String(), "jetstream_api=$JS."+domain+".API")

			// The streams are in the domain's JetStream, not in the local
			// one of the server the binaries connected to.
			for _, srv := range []*server.Server{hub, leaf} {
				nc, err := nats.Connect(srv.ClientURL())
				require.NoError(t, err)
				defer nc.Close()
				js, err := jetstream.New(nc)
				require.NoError(t, err)
				require.Equal(t, srv.Name() == domain, domainStream(t, js), "EVENTS in the local JetStream of %s", srv.Name())
			}

			// Status reads through the domain: the partition record whose
			// floor passed the event.
			want := regexp.MustCompile(`(?m)^\d+\s+\S+\s+\d+\s+1\s+\d+`) // partition, owner, epoch, floor 1
			require.Eventually(t, func() bool {
				out, err = cli(t, env, "consumer", append([]string{"status"}, conn...)...)
				require.NoError(t, err, out)
				return want.MatchString(out)
			}, 30*time.Second, 200*time.Millisecond, "consumer status shows the event settled; last:\n%s", out)
			out, err = cli(t, env, "bridge", append([]string{"verify"}, conn...)...)
			require.NoError(t, err, out)
			require.Contains(t, out, "0 missing")
			out, err = cli(t, env, "consumer", append([]string{"dlq", "list"}, conn...)...)
			require.NoError(t, err, out)
		})
	}
}

// domainStream reports whether the events stream EVENTS exists in the
// JetStream that js reaches.
func domainStream(t *testing.T, js jetstream.JetStream) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := js.Stream(ctx, "EVENTS")
	if err == nil {
		return true
	}
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	return false
}
