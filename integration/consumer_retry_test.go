package integration

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// A 429 with Retry-After: 2 is not retried sooner than 2 s, although the
// subscription's BackOff would retry after 50 ms; the retry is a
// throttled one, in place: no attempt spent (with MaxDeliver 1, a spent
// attempt would dead-letter the event after the 429).
func TestConsumerRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	b := setupJetStream(t)
	var n atomic.Int32
	ep := newHits(t, func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	reg := prometheus.NewRegistry()
	q := b.startConsumer(t, consumer.Config{Registerer: reg}, consumer.Subscription{
		Name: "limited", FilterSubjects: []string{"events.>"}, URL: ep.URL, Secrets: []string{testSecret},
		BackOff: []time.Duration{50 * time.Millisecond}, MaxDeliver: 1, AllowPrivate: true,
		Ordering: consumer.OrderingNone, // a throttled retry stays in place even here
		Start:    consumer.Start{Policy: consumer.StartAll},
	})
	ids := b.publish(t, 1, 1, 1)

	require.Eventually(t, func() bool { return ep.count() >= 2 }, 30*time.Second, 10*time.Millisecond)
	at, keys := ep.snapshot()
	require.Equal(t, []string{ids[0], ids[0]}, keys[:2], "the retry carries the same Idempotency-Key")
	require.GreaterOrEqual(t, at[1].Sub(at[0]), 2*time.Second, "retried %s after the 429 with Retry-After: 2", at[1].Sub(at[0]))
	require.Eventually(t, func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_deliveries_total Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).
# TYPE jsbridge_consumer_deliveries_total counter
jsbridge_consumer_deliveries_total{outcome="ack",status_class="2xx",subscription="limited"} 1
jsbridge_consumer_deliveries_total{outcome="throttled",status_class="4xx",subscription="limited"} 1
`), "jsbridge_consumer_deliveries_total") == nil
	}, 10*time.Second, 10*time.Millisecond, "one throttled attempt, then the ack")
	dead, err := q.Count(b.ctx, "limited")
	require.NoError(t, err)
	require.Zero(t, dead, "retried in place: no attempt spent, nothing dead-lettered")
}
