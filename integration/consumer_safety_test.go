package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
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

// A name resolving to 127.0.0.1 (localhost) is refused when dialled: no
// connection reaches the listener and the event is dead-lettered; the same
// endpoint with AllowPrivate gets it.
func TestConsumerRefusesNameResolvingToLoopback(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
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
	srv.Start()
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	url := fmt.Sprintf("http://localhost:%d/hook", port)

	guarded := subscription.Subscription{Name: "guarded", FilterSubjects: []string{"events.>"}, URL: url, Secrets: []string{testSecret}, AllowHTTP: true,
		Start: subscription.Start{Policy: subscription.StartAll}}
	q := b.startConsumer(t, deliver.Config{}, guarded)
	ids := b.publish(t, 1, 1, 1)

	var letters []deadletter.Stored
	require.Eventually(t, func() bool {
		var err error
		letters, err = q.List(b.ctx, "guarded")
		return err == nil && len(letters) == 1
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, ids[0], letters[0].EventID)
	require.Equal(t, 1, letters[0].Attempts, "a refused address is permanent: dead-lettered at once")
	require.Contains(t, letters[0].Reason, "is loopback")
	require.Zero(t, conns.Load(), "no connection may reach the listener")
	require.Zero(t, requests.Load())

	// Control: with AllowPrivate the same URL is delivered to.
	allowed := guarded
	allowed.Name, allowed.AllowPrivate = "allowed", true
	b.startConsumer(t, deliver.Config{}, allowed)
	require.Eventually(t, func() bool { return requests.Load() == 1 }, 30*time.Second, 20*time.Millisecond)
}
