package embedded_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

func TestStartPublishRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	require.NoError(t, err)
	nc, err := srv.Connect()
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "t.a", []byte("hello"))
	require.NoError(t, err)
	nc.Close()
	srv.Shutdown()

	srv2, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	require.NoError(t, err)
	defer srv2.Shutdown()
	nc2, err := srv2.Connect()
	require.NoError(t, err)
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	require.NoError(t, err)
	st, err := js2.Stream(ctx, "T")
	require.NoError(t, err)
	msg, err := st.GetLastMsgForSubject(ctx, "t.a")
	require.NoError(t, err)
	require.Equal(t, "hello", string(msg.Data))
}

func TestStartRequiresDir(t *testing.T) {
	t.Parallel()
	_, err := embedded.Start(embedded.Config{Port: embedded.RandomPort})
	require.ErrorContains(t, err, "Dir is required")
}

// A taken port fails Start at once with ErrPortInUse naming the port,
// instead of waiting StartTimeout for a server that never becomes ready.
func TestStartOnTakenPortSaysAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = embedded.Start(embedded.Config{Dir: t.TempDir(), Port: port, StartTimeout: time.Minute})
	require.ErrorIs(t, err, embedded.ErrPortInUse)
	require.Contains(t, err.Error(), strconv.Itoa(port))
}
