package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
)

// dlqList runs `consumer dlq list --json` and decodes its lines.
func dlqList(t *testing.T, natsURL string, args ...string) []deadletter.Stored {
	t.Helper()
	out, err := cli(t, nil, "consumer", append([]string{"dlq", "list", "--json", "--nats-url", natsURL}, args...)...)
	require.NoError(t, err, out)
	var letters []deadletter.Stored
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var d deadletter.Stored
		require.NoError(t, json.Unmarshal(sc.Bytes(), &d), out)
		letters = append(letters, d)
	}
	return letters
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// An endpoint answering 422: the event is in the DLQ after one attempt;
// once the endpoint is fixed, `consumer dlq replay --all` delivers it with
// the same Idempotency-Key and empties the DLQ. `dlq purge` needs --yes.
func TestConsumerDeadLetterAndReplayCLI(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
	natsURL := b.srv.ClientURL()
	var fixed atomic.Bool
	ep := newHits(t, func(w http.ResponseWriter, _ *http.Request) {
		if fixed.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusUnprocessableEntity)
	})
	// on-dead-letter skip: the purge below dead-letters two events of one
	// stream (park would hold the second behind the first).
	subFlags := []string{"--nats-url", natsURL, "--start", "all", "--name", "billing", "--url", ep.URL, "--allow-private", "--filter", "events.order.>", "--on-dead-letter", "skip"}
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	opsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	daemon(t, env, "consumer", append([]string{"run", "--ops-addr", opsAddr, "--backoff", "100ms"}, subFlags...)...)
	waitHTTP200(t, "http://"+opsAddr+"/readyz")

	ids := b.publish(t, 42, 1, 1)
	var letters []deadletter.Stored
	require.Eventually(t, func() bool {
		letters = dlqList(t, natsURL)
		return len(letters) == 1
	}, 30*time.Second, 100*time.Millisecond)
	d := letters[0]
	require.Equal(t, "billing", d.Subscription)
	require.Equal(t, ids[0], d.EventID)
	require.Equal(t, 1, d.Attempts, "a 422 is dead-lettered after one attempt")
	require.Equal(t, http.StatusUnprocessableEntity, d.Status)
	require.Contains(t, d.Reason, "422")
	require.Equal(t, "events.order.order-0.OrderNoted", d.Subject)
	time.Sleep(500 * time.Millisecond) // BackOff is 100 ms: a retry would have come by now
	require.Equal(t, 1, ep.count(), "a 422 is not retried")
	require.Contains(t, metricsText(t, opsAddr), `jsbridge_consumer_dead_letters_total{subscription="billing"} 1`)
	out, err := cli(t, nil, "consumer", "dlq", "list", "--nats-url", natsURL, "--subscription", "billing")
	require.NoError(t, err, out)
	require.Contains(t, out, "HTTP 422 Unprocessable Entity", "the table shows the reason")
	require.Empty(t, dlqList(t, natsURL, "--subscription", "other"))

	// Replay while still broken: it stays.
	out, err = cli(t, env, "consumer", append([]string{"dlq", "replay", "--all"}, subFlags...)...)
	require.Error(t, err, out)
	require.Contains(t, out, "1 failed")
	require.Len(t, dlqList(t, natsURL), 1)

	fixed.Store(true)
	out, err = cli(t, env, "consumer", append([]string{"dlq", "replay", "--all"}, subFlags...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "1 replayed, 0 failed")
	_, keys := ep.snapshot()
	require.Equal(t, []string{ids[0], ids[0], ids[0]}, keys, "every attempt and replay carries the event id as Idempotency-Key")
	require.Empty(t, dlqList(t, natsURL), "a delivered dead letter leaves the DLQ")

	// Purge: refused without --yes, then removes what it says.
	fixed.Store(false)
	b.publish(t, 43, 2, 1)
	require.Eventually(t, func() bool { return len(dlqList(t, natsURL)) == 2 }, 30*time.Second, 100*time.Millisecond)
	out, err = cli(t, nil, "consumer", "dlq", "purge", "--nats-url", natsURL, "--subscription", "billing")
	require.Error(t, err, out)
	require.Contains(t, out, "would delete 2 dead letters of subscription billing")
	require.Contains(t, out, "--yes")
	require.Len(t, dlqList(t, natsURL), 2)
	out, err = cli(t, nil, "consumer", "dlq", "purge", "--nats-url", natsURL, "--subscription", "billing", "--yes")
	require.NoError(t, err, out)
	require.Contains(t, out, "deleted 2 dead letters")
	require.Empty(t, dlqList(t, natsURL))
}
