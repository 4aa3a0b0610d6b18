package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrClusterNotReady is returned by StartCluster and Node.Restart when the
// JetStream cluster does not elect a meta leader that knows every node within
// ClusterConfig.StartTimeout.
var ErrClusterNotReady = errors.New("embedded JetStream cluster not ready")

// globalAccount is the account clients land in when the server has no
// accounts configured, as the embedded servers do.
const globalAccount = "$G"

// ClusterConfig configures an in-process JetStream cluster: Nodes servers
// routed to each other on loopback. The zero value is not usable: Dir is
// required.
type ClusterConfig struct {
	// Nodes is the number of servers. Default 3; at least 1. JetStream
	// needs a majority (2 of 3) to elect leaders and accept writes.
	Nodes int
	// Dir holds one file store per node, in Dir/<node name>. Required.
	// Reusing a Dir keeps the streams, messages and consumers of an
	// earlier run.
	Dir string
	// Name is the cluster name; nodes are named Name-1 ... Name-N.
	// Default "jsbridge".
	Name string
	// Host is the listen address of client and route ports. Default
	// "127.0.0.1" (loopback only).
	Host string
	// StartTimeout bounds the wait for the meta leader election, on start
	// and on a node's restart. Default 30 s (an election takes about 3 s).
	StartTimeout time.Duration
	// Logging turns the servers' own logs (to stderr) on. Default off.
	Logging bool
}

// Cluster is a running in-process JetStream cluster.
type Cluster struct {
	cfg   ClusterConfig
	nodes []*Node
}

// Node is one server of a Cluster. Its client and route ports stay the same
// across Shutdown and Restart, so clients holding Cluster.ClientURLs
// reconnect to it.
type Node struct {
	name       string
	dir        string
	clientPort int
	routePort  int
	cluster    *Cluster

	mu  sync.Mutex
	srv *server.Server // nil while shut down
}

// StartCluster starts cfg.Nodes servers with JetStream, routed to each other,
// and returns once a meta leader is elected that knows all nodes and a
// JetStream API call (account info) is answered, so streams can be created
// at once. It fails when Dir is empty, Nodes is negative, a server does not
// start (ErrPortInUse when free ports were taken by others three times in
// a row), or the cluster is not ready within StartTimeout
// (ErrClusterNotReady); started nodes are shut down then.
func StartCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded: ClusterConfig.Dir is required (JetStream store directory)")
	}
	if cfg.Nodes < 0 {
		return nil, fmt.Errorf("embedded: ClusterConfig.Nodes %d: want at least 1", cfg.Nodes)
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Name == "" {
		cfg.Name = "jsbridge"
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	// Every node must know the others' route ports before any starts, so
	// they cannot be chosen by the servers (port 0): take free ones now.
	// Client ports are fixed the same way so a restarted node is found
	// again under the URL clients hold. Another program may take one of
	// them before its node binds it: then try again with others.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		var c *Cluster
		if c, err = startCluster(cfg); err == nil {
			return c, nil
		}
		if !errors.Is(err, ErrPortInUse) {
			break
		}
	}
	return nil, err
}

// startCluster is one attempt of StartCluster with freshly reserved ports.
func startCluster(cfg ClusterConfig) (*Cluster, error) {
	ports, err := freePorts(cfg.Host, 2*cfg.Nodes)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg}
	for i := range cfg.Nodes {
		name := fmt.Sprintf("%s-%d", cfg.Name, i+1)
		c.nodes = append(c.nodes, &Node{
			name:       name,
			dir:        filepath.Join(cfg.Dir, name),
			clientPort: ports[2*i],
			routePort:  ports[2*i+1],
			cluster:    c,
		})
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	if err := c.waitReady(cfg.StartTimeout); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// freePorts reserves n distinct free TCP ports on host by listening on port
// 0 and releasing them together. Another program may take one before a
// server binds it; the node's start then fails with ErrPortInUse.
func freePorts(host string, n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("embedded: reserve a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// options builds a fresh server.Options for the node: NewServer changes the
// Options it is given, so a restart must not reuse the old one.
func (n *Node) options() *server.Options {
	cfg := n.cluster.cfg
	var routes []string
	for _, o := range n.cluster.nodes {
		if o != n {
			routes = append(routes, "nats-route://"+net.JoinHostPort(cfg.Host, strconv.Itoa(o.routePort)))
		}
	}
	opts := &server.Options{
		ServerName: n.name,
		Host:       cfg.Host,
		Port:       n.clientPort,
		JetStream:  true,
		StoreDir:   n.dir,
		NoSigs:     true,
		NoLog:      !cfg.Logging,
		Cluster: server.ClusterOpts{
			Name: cfg.Name,
			Host: cfg.Host,
			Port: n.routePort,
		},
		Routes: server.RoutesFromStr(strings.Join(routes, ",")),
	}
	opts.JetStreamLimits.DefaultMaxConsumers = UnlimitedConsumers
	return opts
}

func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return nil
	}
	// nats-server only logs a taken port and never becomes ready: say it
	// at once, as Start does.
	for _, port := range []int{n.clientPort, n.routePort} {
		ln, err := net.Listen("tcp", net.JoinHostPort(n.cluster.cfg.Host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("%w: %s: %s:%d: %w", ErrPortInUse, n.name, n.cluster.cfg.Host, port, err)
		}
		_ = ln.Close()
	}
	srv, err := server.NewServer(n.options())
	if err != nil {
		return fmt.Errorf("embedded: new server %s: %w", n.name, err)
	}
	if n.cluster.cfg.Logging {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(n.cluster.cfg.StartTimeout) {
		srv.Shutdown()
		return fmt.Errorf("%w: %s after %s (client port %d, route port %d)",
			ErrNotReady, n.name, n.cluster.cfg.StartTimeout, n.clientPort, n.routePort)
	}
	n.srv = srv
	return nil
}

// server returns the running server, or nil while the node is shut down.
func (n *Node) server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// waitReady polls until a running node is meta leader, knows every running
// node as a peer, and every running node is current with it; then until a
// JetStream API call through the joined URLs is answered.
func (c *Cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !c.metaReady() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: no meta leader with %d peers after %s", ErrClusterNotReady, len(c.nodes), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nc, err := nats.Connect(c.ClientURLs())
	if err != nil {
		return fmt.Errorf("embedded: connect %s: %w", c.ClientURLs(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("embedded: jetstream context: %w", err)
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: account info after %s: %w", ErrClusterNotReady, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Cluster) metaReady() bool {
	running, ready := 0, false
	var leader *server.Server
	for _, n := range c.nodes {
		srv := n.server()
		if srv == nil {
			continue
		}
		running++
		if !srv.JetStreamIsCurrent() {
			return false
		}
		if srv.JetStreamIsLeader() {
			leader = srv
		}
	}
	// The leader lists the peers it has heard from and not seen leave; a
	// node just shut down may still be among them for a moment.
	if leader != nil {
		ready = len(leader.JetStreamClusterPeers()) >= running
	}
	return ready
}

// Nodes returns the cluster's nodes, in order (Name-1 first).
func (c *Cluster) Nodes() []*Node { return c.nodes }

// ClientURLs returns every node's client URL joined by commas, e.g.
// "nats://127.0.0.1:4222,nats://127.0.0.1:4223,...": the form nats.Connect
// and the --nats-url flag take. Nodes that are shut down are included, so a
// client reconnects to them once they are back.
func (c *Cluster) ClientURLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.ClientURL()
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection to the cluster (any node, failing over
// between them) with the given options.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(c.ClientURLs(), opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect %s: %w", c.ClientURLs(), err)
	}
	return nc, nil
}

// StreamLeader returns the node currently leading the JetStream stream (in
// the default account), or nil when no running node leads it (the stream
// does not exist, or an election is under way).
func (c *Cluster) StreamLeader(stream string) *Node {
	for _, n := range c.nodes {
		if srv := n.server(); srv != nil && srv.JetStreamIsStreamLeader(globalAccount, stream) {
			return n
		}
	}
	return nil
}

// Shutdown stops every node and waits until they have stopped. JetStream
// data stays in Dir. Safe to call more than once.
func (c *Cluster) Shutdown() {
	for _, n := range c.nodes {
		n.Shutdown()
	}
}

// Name returns the node's server name, e.g. "jsbridge-2".
func (n *Node) Name() string { return n.name }

// ClientURL returns the node's client URL, e.g. "nats://127.0.0.1:40123";
// it stays the same across Shutdown and Restart.
func (n *Node) ClientURL() string {
	return "nats://" + net.JoinHostPort(n.cluster.cfg.Host, strconv.Itoa(n.clientPort))
}

// Running reports whether the node is started (not shut down).
func (n *Node) Running() bool { return n.server() != nil }

// Shutdown stops the node and waits until it has stopped; its store stays
// in its directory for Restart. It is not quite a kill: nats-server first
// steps down the Raft groups the node leads, so their leadership moves at
// once instead of after an election timeout (4–9 s). Safe to call more
// than once.
func (n *Node) Shutdown() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts a shut-down node again from its store, on the same ports,
// and waits until the cluster has a meta leader the node is current with.
// The node's streams catch up from their leaders afterwards; poll
// LocalStreamState to see that. A running node is left as it is. It fails
// with ErrPortInUse when another program took one of the node's ports,
// and with ErrClusterNotReady as StartCluster does.
func (n *Node) Restart() error {
	if err := n.start(); err != nil {
		return err
	}
	return n.cluster.waitReady(n.cluster.cfg.StartTimeout)
}

// LocalStreamState is a stream's state as one node's own replica holds it.
type LocalStreamState struct {
	// Msgs is the number of messages stored.
	Msgs uint64
	// FirstSeq and LastSeq are the stream sequences of the first and last
	// message stored.
	FirstSeq, LastSeq uint64
}

// ErrNodeDown is returned by LocalStreamState when the node is shut down.
var ErrNodeDown = errors.New("embedded: node is shut down")

// LocalStreamState returns the state of the stream's replica on this node,
// not the leader's answer a client would get: it shows whether a restarted
// node has caught up. ok is false when the node holds no replica of the
// stream. It fails with ErrNodeDown while the node is shut down.
func (n *Node) LocalStreamState(stream string) (state LocalStreamState, ok bool, err error) {
	srv := n.server()
	if srv == nil {
		return LocalStreamState{}, false, fmt.Errorf("%w: %s", ErrNodeDown, n.name)
	}
	info, err := srv.Jsz(&server.JSzOptions{Account: globalAccount, Streams: true})
	if err != nil {
		return LocalStreamState{}, false, fmt.Errorf("embedded: jsz on %s: %w", n.name, err)
	}
	for _, acc := range info.AccountDetails {
		for _, sd := range acc.Streams {
			if sd.Name == stream {
				return LocalStreamState{Msgs: sd.State.Msgs, FirstSeq: sd.State.FirstSeq, LastSeq: sd.State.LastSeq}, true, nil
			}
		}
	}
	return LocalStreamState{}, false, nil
}
