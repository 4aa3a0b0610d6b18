// Package jstest starts embedded JetStream servers for tests, as pgtest
// does the throwaway Postgres: real servers, shut down when the test ends.
package jstest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
)

// Start starts an embedded JetStream server with cfg and shuts it down at
// the test's cleanup. An empty cfg.Dir becomes a fresh t.TempDir(), and
// cfg.Port 0 becomes embedded.RandomPort (not 4222: tests run in
// parallel). It fails the test when the server does not start.
func Start(t testing.TB, cfg embedded.Config) *embedded.Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Port == 0 {
		cfg.Port = embedded.RandomPort
	}
	srv, err := embedded.Start(cfg)
	if err != nil {
		t.Fatalf("jstest: start JetStream: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Connect opens a client connection to srv, closed at the test's cleanup,
// and returns it with its JetStream context.
func Connect(t testing.TB, srv *embedded.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := srv.Connect()
	return connected(t, nc, err)
}

// connected fails the test on err, closes nc at cleanup and returns it
// with its JetStream context.
func connected(t testing.TB, nc *nats.Conn, err error) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	if err != nil {
		t.Fatalf("jstest: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jstest: JetStream context: %v", err)
	}
	return nc, js
}

// StartCluster starts an in-process JetStream cluster with cfg (default 3
// nodes) and shuts it down at the test's cleanup. An empty cfg.Dir becomes
// a fresh t.TempDir(). It returns once streams can be created, and fails
// the test when the cluster does not form.
func StartCluster(t testing.TB, cfg embedded.ClusterConfig) *embedded.Cluster {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	c, err := embedded.StartCluster(cfg)
	if err != nil {
		t.Fatalf("jstest: start JetStream cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// ConnectCluster opens a client connection to any node of c (failing over
// between them, reconnecting without limit), closed at the test's cleanup,
// and returns it with its JetStream context.
func ConnectCluster(t testing.TB, c *embedded.Cluster) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := c.Connect(nats.MaxReconnects(-1))
	return connected(t, nc, err)
}
