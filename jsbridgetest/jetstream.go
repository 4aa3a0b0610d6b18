package jsbridgetest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
)

// StartJetStream starts an embedded JetStream server with cfg and shuts it
// down at the test's cleanup. An empty cfg.Dir becomes a fresh
// t.TempDir(), and cfg.Port 0 embedded.RandomPort (not 4222: tests run in
// parallel). It fails the test when the server does not start.
func StartJetStream(t testing.TB, cfg embedded.Config) *embedded.Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Port == 0 {
		cfg.Port = embedded.RandomPort
	}
	srv, err := embedded.Start(cfg)
	if err != nil {
		t.Fatalf("jsbridgetest: start JetStream: %v", err)
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
		t.Fatalf("jsbridgetest: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jsbridgetest: JetStream context: %v", err)
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
		t.Fatalf("jsbridgetest: start JetStream cluster: %v", err)
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

// Stored returns the messages stored in JetStream stream whose subjects
// match filter (a subject filter such as "events.order.>"; "" for all), in
// stream order, read with an ordered consumer that leaves no trace. It
// reads what the stream holds when called and fails the test on an error
// (a missing stream included).
func Stored(t testing.TB, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("jsbridgetest: JetStream stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("jsbridgetest: JetStream stream %s: %v", stream, err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if filter != "" {
		cfg.FilterSubjects = []string{filter}
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		t.Fatalf("jsbridgetest: read JetStream stream %s: %v", stream, err)
	}
	var out []jetstream.Msg
	for {
		// The last sequence ends the read; with a filter, messages up to it
		// may not match, so the pending count of the consumer decides.
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("jsbridgetest: read JetStream stream %s: %v", stream, err)
			}
			return out // no message within a second: nothing more matches
		}
		out = append(out, msg)
		md, err := msg.Metadata()
		if err != nil {
			t.Fatalf("jsbridgetest: read JetStream stream %s: %v", stream, err)
		}
		if md.NumPending == 0 {
			return out
		}
	}
}
