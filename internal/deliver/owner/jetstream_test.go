package owner

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// startJetStream starts an embedded JetStream server and returns a client
// of it; both stop at cleanup.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv := startServer(t)
	js, _ := connect(t, srv)
	return js
}

// startServer starts an embedded JetStream server that stops at cleanup.
func startServer(t *testing.T) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	return srv
}

// connect returns a client of srv on a connection of its own, closed at
// cleanup.
func connect(t *testing.T, srv *embedded.Server, opts ...nats.Option) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	nc, err := srv.Connect(opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js, nc
}
