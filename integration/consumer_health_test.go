package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// An endpoint answering 410 Gone to `consumer run`: the subscription is
// disabled within one attempt per event, nothing dead-lettered; the
// operator's URL gets the signed endpoint.disabled webhook, the ops
// stream the ops.endpoint.disabled event, `consumer status` and the
// metrics show it; `consumer subscriptions enable` resumes with nothing
// lost.
func TestConsumerGoneDisablesAndEnableResumesCLI(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
	natsURL := b.srv.ClientURL()
	var gone atomic.Bool
	gone.Store(true)
	ep := newHits(t, func(w http.ResponseWriter, _ *http.Request) {
		if gone.Load() {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	verifier, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	var mu sync.Mutex
	var hooks []consumer.OpsWebhook
	ops := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if verifier.Verify(r.Header, body) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var h consumer.OpsWebhook
		if json.Unmarshal(body, &h) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		hooks = append(hooks, h)
		mu.Unlock()
	}))
	t.Cleanup(ops.Close)

	env := []string{"JSBRIDGE_SECRET=" + testSecret, "JSBRIDGE_OPS_WEBHOOK_SECRET=" + testSecret}
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	daemon(t, env, "consumer", "run", "--ops-addr", opsAddr, "--nats-url", natsURL, "--start", "all", "--name", "billing",
		"--url", ep.URL, "--allow-private", "--filter", "events.order.>", "--max-deliver", "2", "--ops-webhook-url", ops.URL)
	waitHTTP200(t, "http://"+opsAddr+"/readyz")

	ids := b.publish(t, 1, 6, 2)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(hooks) == 1 }, 30*time.Second, 50*time.Millisecond, "operational webhook")
	mu.Lock()
	h := hooks[0]
	mu.Unlock()
	require.Equal(t, wire.OpsWebhookEndpointDisabled, h.Type)
	require.Equal(t, "billing", h.Data.Subscription)
	require.Equal(t, consumer.ReasonGone, h.Data.Reason)
	require.Contains(t, h.Data.LastError, "410")

	// The event on ops.endpoint.disabled is in the ops stream.
	require.Eventually(t, func() bool {
		s, err := b.js.Stream(t.Context(), wire.DefaultOpsStream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(t.Context(), wire.SubjectEndpointDisabled)
		return err == nil && strings.Contains(string(m.Data), `"reason":"gone"`)
	}, 10*time.Second, 50*time.Millisecond, "event on %s", wire.SubjectEndpointDisabled)

	out, err := cli(t, nil, "consumer", "status", "--nats-url", natsURL)
	require.NoError(t, err, out)
	require.Contains(t, out, "DISABLED")
	require.Regexp(t, `billing\s+gone`, out)
	require.Contains(t, metricsText(t, opsAddr), `jsbridge_consumer_endpoint_disabled{subscription="billing"} 1`)

	// Two streams, ordered: at most one attempt per stream's head.
	sent := ep.count()
	require.LessOrEqual(t, sent, 2, "disabled within one attempt")
	require.Never(t, func() bool { return ep.count() > sent }, time.Second, 50*time.Millisecond, "nothing sent while disabled")

	gone.Store(false)
	out, err = cli(t, nil, "consumer", "subscriptions", "enable", "billing", "--nats-url", natsURL)
	require.NoError(t, err, out)
	require.Contains(t, out, "enabled")
	require.Eventually(t, func() bool { return ep.distinct() == len(ids) }, 30*time.Second, 50*time.Millisecond, "every event delivered after enable")
	require.Empty(t, dlqList(t, natsURL), "nothing dead-lettered")
	require.Eventually(t, func() bool {
		return strings.Contains(metricsText(t, opsAddr), `jsbridge_consumer_endpoint_disabled{subscription="billing"} 0`)
	}, 5*time.Second, 50*time.Millisecond)
	out, err = cli(t, nil, "consumer", "status", "--nats-url", natsURL)
	require.NoError(t, err, out)
	require.NotContains(t, out, "DISABLED")
}
