package deliver

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// startJetStream starts an embedded JetStream server for the package's
// internal tests and returns a client of it; both stop at cleanup.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := startJetStreamServer(t)
	return js
}

// startJetStreamServer is startJetStream, returning the server too.
func startJetStreamServer(t *testing.T) (*embedded.Server, jetstream.JetStream) {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return srv, js
}
