package startup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// tokenServer starts a real nats-server that requires token.
func tokenServer(t *testing.T, token string) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, Authorization: token, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(srv.Shutdown)
	return srv.ClientURL()
}

func TestConnectNATSRefusedCredentialsArePermanent(t *testing.T) {
	t.Parallel()
	url := tokenServer(t, "s3cret")
	w, _ := newWaiter(0)
	_, err := startup.ConnectNATS(context.Background(), w, url, nats.Name("test"))
	require.True(t, startup.IsPermanent(err), "%v", err)
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.Contains(t, strings.ToLower(err.Error()), "authorization violation")
	require.Contains(t, err.Error(), "refused")

	u := "nats://s3cret@" + url[len("nats://"):]
	nc, err := startup.ConnectNATS(context.Background(), w, u)
	require.NoError(t, err)
	nc.Close()
}

func TestConnectNATSWaitsForAServerThatComesUp(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	w, logs := newWaiter(0)
	w.SetBackoff(50*time.Millisecond, 200*time.Millisecond)
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = jsbridgetest.StartJetStream(t, embedded.Config{Port: port})
	}()
	nc, err := startup.ConnectNATS(context.Background(), w, url, startup.NATSOptions(nil, "test")...)
	require.NoError(t, err)
	defer nc.Close()
	require.True(t, nc.IsConnected())
	require.Contains(t, logs.String(), "waiting for NATS at "+url)
}

func TestJetStreamPermanent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "A", Subjects: []string{"events.>"}})
	require.NoError(t, err)

	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"events.order.>"}})
	require.Error(t, err)
	require.True(t, startup.JetStreamPermanent(err), "subjects overlap: %v", err)
	require.True(t, startup.IsPermanent(startup.JetStreamErr(err)))

	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "C", Subjects: []string{"c.>"}, Replicas: 3})
	require.Error(t, err)
	require.True(t, startup.JetStreamPermanent(err), "replicas on a single server: %v", err)

	_, err = js.Stream(ctx, "MISSING")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.False(t, startup.JetStreamPermanent(err), "a stream not found yet is waited for")
	require.False(t, startup.IsPermanent(startup.JetStreamErr(err)))
	require.NoError(t, startup.JetStreamErr(nil))

	for _, transient := range []error{nats.ErrTimeout, nats.ErrNoResponders, jetstream.ErrJetStreamNotEnabled, context.DeadlineExceeded,
		&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"},
		&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"},
		errors.New("dial tcp: connection refused")} {
		require.False(t, startup.JetStreamPermanent(fmt.Errorf("wrapped: %w", transient)), "%v", transient)
	}
	require.True(t, startup.JetStreamPermanent(fmt.Errorf("x: %w", nats.ErrAuthorization)))
}

// tlsTimeout is a net.Error that timed out, as a TLS handshake with a
// server too slow to answer returns.
type tlsTimeout struct{}

func (tlsTimeout) Error() string   { return "i/o timeout" }
func (tlsTimeout) Timeout() bool   { return true }
func (tlsTimeout) Temporary() bool { return true }

func TestNATSPermanentTLSHandshake(t *testing.T) {
	t.Parallel()
	// A server rejecting the client certificate closes the connection
	// right after the handshake; nats.go wraps that in ErrTLS.
	require.True(t, startup.NATSPermanent(fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, errors.New("EOF"))))
	require.False(t, startup.NATSPermanent(fmt.Errorf("%w: %w", nats.ErrTLS, tlsTimeout{})), "a handshake that timed out is waited for")
	// With TLS 1.3 the server's alert can arrive after the handshake, as
	// crypto/tls reports it: an OpError "remote error".
	require.True(t, startup.NATSPermanent(&net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}))
	require.False(t, startup.NATSPermanent(&net.OpError{Op: "dial", Err: errors.New("connection refused")}))
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "nats://a:4222,nats://b:4222", startup.RedactURL("nats://user:pw@a:4222, nats://tok@b:4222"))
	require.Equal(t, "localhost:4222", startup.RedactURL("tok@localhost:4222"))
}

// A server older than 2.14 is refused at connect, permanently, with an
// error naming its version and the required one: a fake server that
// answers the client protocol (INFO, PONG) as 2.13.4 stands for it. The
// embedded server (the module's nats-server) is accepted.
func TestConnectNATSRefusesAServerOlderThanRequired(t *testing.T) {
	t.Parallel()
	w, _ := newWaiter(0)
	_, err := startup.ConnectNATS(context.Background(), w, fakeServer(t, "2.13.4"), nats.Name("test"))
	require.True(t, startup.IsPermanent(err), "%v", err)
	require.ErrorIs(t, err, startup.ErrServerTooOld)
	require.ErrorContains(t, err, `nats-server "2.13.4"`)
	require.ErrorContains(t, err, "needs 2.14 or later")

	js := jsbridgetest.StartJetStream(t, embedded.Config{})
	nc, err := startup.ConnectNATS(context.Background(), w, js.ClientURL(), nats.Name("test"))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, startup.CheckServerVersion(nc.ConnectedServerVersion()))
}

func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"2.14.0": true, "2.15.2": true, "v2.14.0-RC.1": true, "3.0.0": true, "2.14": true,
		"2.13.9": false, "2.9.25": false, "1.99.0": false, "": false, "x.y": false,
	} {
		err := startup.CheckServerVersion(v)
		if ok {
			require.NoError(t, err, v)
			continue
		}
		require.ErrorIs(t, err, startup.ErrServerTooOld, v)
		require.ErrorContains(t, err, fmt.Sprintf("%q", v))
	}
}

// fakeServer listens on a loopback port and speaks just enough of the NATS
// client protocol for a connect: an INFO naming version, then PONG for
// every PING. It returns the URL.
func fakeServer(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "INFO {\"server_id\":\"FAKE\",\"version\":%q,\"proto\":1,\"max_payload\":1048576,\"headers\":true}\r\n", version)
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if strings.Contains(string(buf[:n]), "PING") {
						_, _ = c.Write([]byte("PONG\r\n"))
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}
