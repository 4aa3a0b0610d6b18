package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// Environment of the test binary when it runs as one node of a JetStream
// cluster (see TestMain and natsCluster): the node's name, its store
// directory, and its client, route and monitoring ports, and the other
// nodes' route URLs (comma-separated).
const (
	envServeNodeName    = "JSBRIDGE_TEST_SERVE_NODE_NAME"
	envServeNodeDir     = "JSBRIDGE_TEST_SERVE_NODE_DIR"
	envServeNodePorts   = "JSBRIDGE_TEST_SERVE_NODE_PORTS" // client,route,monitor
	envServeNodeRoutes  = "JSBRIDGE_TEST_SERVE_NODE_ROUTES"
	natsClusterName     = "jsbridge-test"
	natsClusterReadyFor = 60 * time.Second
)

// serveNATSNode runs one JetStream cluster node until SIGTERM or until the
// test process that started it is gone; SIGKILL is the kill under test.
func serveNATSNode() int {
	var ports [3]int
	for i, p := range strings.Split(os.Getenv(envServeNodePorts), ",") {
		n, err := strconv.Atoi(p)
		if err != nil || i >= len(ports) {
			fmt.Fprintf(os.Stderr, "%s %q: want client,route,monitor ports\n", envServeNodePorts, os.Getenv(envServeNodePorts))
			return 2
		}
		ports[i] = n
	}
	parent := os.Getppid()
	opts := &server.Options{
		ServerName: os.Getenv(envServeNodeName),
		Host:       "127.0.0.1",
		Port:       ports[0],
		HTTPHost:   "127.0.0.1",
		HTTPPort:   ports[2],
		JetStream:  true,
		StoreDir:   os.Getenv(envServeNodeDir),
		NoSigs:     true,
		NoLog:      true,
		Cluster:    server.ClusterOpts{Name: natsClusterName, Host: "127.0.0.1", Port: ports[1]},
		Routes:     server.RoutesFromStr(os.Getenv(envServeNodeRoutes)),
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go srv.Start()
	if !srv.ReadyForConnections(natsClusterReadyFor) {
		fmt.Fprintf(os.Stderr, "NATS node %s not ready after %v\n", opts.ServerName, natsClusterReadyFor)
		return 1
	}
	defer srv.Shutdown()
	return serveUntilStopped(parent)
}

// natsCluster is a 3-node JetStream cluster whose nodes are processes of
// their own (the test binary, see serveNATSNode), so that a node can be
// SIGKILLed: no store flushed, no connection closed by the server.
type natsCluster struct {
	t     *testing.T
	nodes []*natsNode
}

// natsNode is one node of a natsCluster.
type natsNode struct {
	name                               string
	dir                                string
	clientPort, routePort, monitorPort int
	routes                             string
	cmd                                *exec.Cmd
	done                               chan struct{}
}

// startNATSCluster starts a 3-node cluster and returns once it has a
// JetStream meta leader that knows every node. Every node is stopped at
// cleanup.
func startNATSCluster(t *testing.T) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t}
	for i := range 3 {
		c.nodes = append(c.nodes, &natsNode{name: fmt.Sprintf("n%d", i+1), dir: t.TempDir(),
			clientPort: freePort(t), routePort: freePort(t), monitorPort: freePort(t)})
	}
	for _, n := range c.nodes {
		var routes []string
		for _, o := range c.nodes {
			if o != n {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.routePort))
			}
		}
		n.routes = strings.Join(routes, ",")
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
	})
	for _, n := range c.nodes {
		c.start(n)
	}
	require.Eventually(t, func() bool {
		for _, n := range c.nodes {
			info, err := n.jsz(false)
			if err != nil || info.Meta == nil || info.Meta.Leader == "" || info.Meta.Size < len(c.nodes) {
				return false
			}
		}
		return true
	}, natsClusterReadyFor, 50*time.Millisecond, "a JetStream meta leader that knows all three nodes")
	return c
}

// ClientURLs returns the nodes' client URLs, comma-separated.
func (c *natsCluster) ClientURLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", n.clientPort)
	}
	return strings.Join(urls, ",")
}

// start starts node n's process and waits until it accepts connections.
func (c *natsCluster) start(n *natsNode) {
	c.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envServeNodeName+"="+n.name, envServeNodeDir+"="+n.dir,
		envServeNodePorts+"="+fmt.Sprintf("%d,%d,%d", n.clientPort, n.routePort, n.monitorPort), envServeNodeRoutes+"="+n.routes)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(c.t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	require.Eventually(c.t, func() bool {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.clientPort), time.Second)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	}, natsClusterReadyFor, 20*time.Millisecond, "NATS node %s on port %d", n.name, n.clientPort)
}

// killNode SIGKILLs node n and waits until it is gone.
func (c *natsCluster) killNode(n *natsNode) {
	c.t.Helper()
	require.NoError(c.t, n.cmd.Process.Signal(syscall.SIGKILL))
	<-n.done
	n.cmd = nil
}

// stop stops a running node (SIGTERM) and waits for it to exit.
func (n *natsNode) stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// jsz asks node n's monitoring port for its JetStream state: with streams,
// every stream replica it holds, as its own store has it.
func (n *natsNode) jsz(streams bool) (*server.JSInfo, error) {
	if n.cmd == nil {
		return nil, fmt.Errorf("node %s is killed", n.name)
	}
	q := ""
	if streams {
		q = "?accounts=true&streams=true"
	}
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz%s", n.monitorPort, q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("node %s: /jsz: %s", n.name, resp.Status)
	}
	var info server.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("node %s: /jsz: %w", n.name, err)
	}
	return &info, nil
}

// streamState returns node n's own replica of stream (ok false when the
// node is killed or holds none), and whether n leads the stream.
func (n *natsNode) streamState(stream string) (state server.StreamState, leader, ok bool) {
	info, err := n.jsz(true)
	if err != nil {
		return server.StreamState{}, false, false
	}
	for _, acc := range info.AccountDetails {
		for _, sd := range acc.Streams {
			if sd.Name == stream {
				return sd.State, sd.Cluster != nil && sd.Cluster.Leader == n.name, true
			}
		}
	}
	return server.StreamState{}, false, false
}

// failoverNodes are the failover test's three JetStream nodes as it kills
// and restarts them: in-process (embedded.Cluster, a kill is a Shutdown)
// or processes of their own (natsCluster, a kill is SIGKILL).
type failoverNodes interface {
	ClientURLs() string
	// leader waits until a running node leads stream and returns its name.
	leader(t *testing.T, stream string) string
	kill(t *testing.T, name string)
	restart(t *testing.T, name string)
	// lastSeq is the last sequence of node name's own replica of stream
	// (ok false while the node is down or holds none).
	lastSeq(name, stream string) (seq uint64, ok bool)
	// inSync reports whether every node's replica of stream equals the
	// leader's.
	inSync(stream string) bool
}

func (c *natsCluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no NATS node %q", name)
	return nil
}

func (c *natsCluster) leader(t *testing.T, stream string) string {
	t.Helper()
	var name string
	require.Eventually(t, func() bool {
		for _, n := range c.nodes {
			if _, leads, ok := n.streamState(stream); ok && leads {
				name = n.name
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "a leader of %s", stream)
	return name
}

func (c *natsCluster) kill(t *testing.T, name string)    { t.Helper(); c.killNode(c.node(name)) }
func (c *natsCluster) restart(t *testing.T, name string) { t.Helper(); c.start(c.node(name)) }

func (c *natsCluster) lastSeq(name, stream string) (uint64, bool) {
	s, _, ok := c.node(name).streamState(stream)
	return s.LastSeq, ok
}

func (c *natsCluster) inSync(stream string) bool {
	var first *server.StreamState
	for _, n := range c.nodes {
		s, _, ok := n.streamState(stream)
		if !ok {
			return false
		}
		if first == nil {
			first = &s
		} else if s.Msgs != first.Msgs || s.FirstSeq != first.FirstSeq || s.LastSeq != first.LastSeq {
			return false
		}
	}
	return true
}

// embeddedNodes are an embedded.Cluster's nodes as failoverNodes.
type embeddedNodes struct{ c *embedded.Cluster }

func (e embeddedNodes) ClientURLs() string { return e.c.ClientURLs() }

func (e embeddedNodes) leader(t *testing.T, stream string) string {
	t.Helper()
	return waitStreamLeader(t, e.c, stream).Name()
}

func (e embeddedNodes) node(t *testing.T, name string) *embedded.Node {
	for _, n := range e.c.Nodes() {
		if n.Name() == name {
			return n
		}
	}
	t.Fatalf("no embedded node %q", name)
	return nil
}

func (e embeddedNodes) kill(t *testing.T, name string) { t.Helper(); e.node(t, name).Shutdown() }

func (e embeddedNodes) restart(t *testing.T, name string) {
	t.Helper()
	require.NoError(t, e.node(t, name).Restart())
}

func (e embeddedNodes) lastSeq(name, stream string) (uint64, bool) {
	for _, n := range e.c.Nodes() {
		if n.Name() == name {
			s, ok, err := n.LocalStreamState(stream)
			return s.LastSeq, ok && err == nil
		}
	}
	return 0, false
}

func (e embeddedNodes) inSync(stream string) bool {
	var first *embedded.LocalStreamState
	for _, n := range e.c.Nodes() {
		s, ok, err := n.LocalStreamState(stream)
		if err != nil || !ok {
			return false
		}
		if first == nil {
			first = &s
		} else if s != *first {
			return false
		}
	}
	return true
}
