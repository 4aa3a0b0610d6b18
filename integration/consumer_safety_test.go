package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// The cloud metadata address is refused at start, before anything is sent;
// the error names the URL and allow_private and never the secret, nor
// does --help.
func TestConsumerRefusesMetadataEndpointAtStart(t *testing.T) {
	t.Parallel()
	const secret = "whsec_c2FmZXR5LXRlc3Qtc2VjcmV0LXZhbHVlLTEyMzQ="
	out, err := cli(t, []string{"JSBRIDGE_SECRET=" + secret}, "consumer", "run",
		"--nats-url", "nats://127.0.0.1:1", "--url", "http://169.254.169.254/latest/meta-data/", "--allow-http")
	require.Error(t, err, out)
	require.Contains(t, out, "169.254.169.254")
	require.Contains(t, out, "allow_private", "the refusal names the YAML key that allows it")
	require.Contains(t, out, "--allow-private", "and the flag")
	require.NotContains(t, out, secret)
	require.NotContains(t, out, strings.TrimPrefix(secret, "whsec_"))

	for _, args := range [][]string{{"run", "--help"}, {"dlq", "replay", "--help"}} {
		out, err = cli(t, []string{"JSBRIDGE_SECRET=" + secret}, "consumer", args...)
		require.NoError(t, err, out)
		require.Contains(t, out, "--secret")
		require.NotContains(t, out, strings.TrimPrefix(secret, "whsec_"), "--help never shows a secret")
	}
}

// A name resolving to a loopback or private address is refused when
// dialled: no connection reaches the listener and the event is
// dead-lettered; the same endpoint with AllowPrivate gets it. The name is
// the host's own (127.0.0.1 from /etc/hosts on most machines, a private
// address in most containers): "localhost" itself never gets that far,
// the public package refuses it at New (RFC 6761).
func TestConsumerRefusesNameResolvingToLoopback(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	addrs, err := net.DefaultResolver.LookupNetIP(b.ctx, "ip", host)
	require.NoError(t, err, "the host's name %q must resolve", host)
	for _, a := range addrs {
		require.True(t, a.IsLoopback() || a.IsPrivate(), "the host's name %q resolves to %s, neither loopback nor private", host, a)
	}
	var conns, requests atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	// On every address, so the name reaches it whatever it resolves to.
	l, err := net.Listen("tcp", ":0")
	require.NoError(t, err)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	port := l.Addr().(*net.TCPAddr).Port
	url := fmt.Sprintf("http://%s:%d/hook", host, port)

	local := consumer.Subscription{Name: "local", FilterSubjects: []string{"events.>"}, URL: fmt.Sprintf("http://localhost:%d/hook", port),
		Secrets: []string{testSecret}, AllowHTTP: true}
	_, err = consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{local}})
	require.ErrorIs(t, err, consumer.ErrForbiddenAddress)
	require.Contains(t, err.Error(), "localhost is loopback")

	guarded := consumer.Subscription{Name: "guarded", FilterSubjects: []string{"events.>"}, URL: url, Secrets: []string{testSecret}, AllowHTTP: true,
		Start: consumer.Start{Policy: consumer.StartAll}}
	q := b.startConsumer(t, consumer.Config{}, guarded)
	ids := b.publish(t, 1, 1, 1)

	var letters []consumer.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		letters, err = q.List(b.ctx, "guarded")
		return err == nil && len(letters) == 1
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, ids[0], letters[0].EventID)
	require.Equal(t, 1, letters[0].Attempts, "a refused address is permanent: dead-lettered at once")
	require.Regexp(t, `is (loopback|private)`, letters[0].Reason)
	require.Zero(t, conns.Load(), "no connection may reach the listener")
	require.Zero(t, requests.Load())

	// Control: with AllowPrivate the same URL is delivered to. On a
	// server of its own: a second replica on the first would share its
	// partitions while knowing another set of subscriptions.
	allowed := guarded
	allowed.Name, allowed.AllowPrivate = "allowed", true
	control := setupJetStream(t)
	control.startConsumer(t, consumer.Config{}, allowed)
	control.publish(t, 1, 1, 1)
	require.Eventually(t, func() bool { return requests.Load() == 1 }, 30*time.Second, 20*time.Millisecond)
}
