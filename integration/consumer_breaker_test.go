package integration

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
)

// Three subscriptions on one stream; one endpoint answers 503 until the
// other two have every event (at least minOutage). The other two get
// everything while it is still down; the failing one gets everything after
// it recovers; during the outage it sees no more requests than the
// breaker's threshold, the requests already in flight when it opened, and
// one probe per open timeout; nothing is dead-lettered.
//
// The outage ends on an event (the healthy endpoints have everything), not
// on a timer, and the breaker is checked by its transitions, not by a
// state read at one instant: a loaded machine stretches the delivery to
// the healthy endpoints past any fixed outage, and at any moment past the
// open timeout the tripped breaker may read half-open (its probe not yet
// sent) as well as open.
func TestConsumerBreakerIsolatesFailingEndpoint(t *testing.T) {
	t.Parallel()
	const (
		events      = 300
		minOutage   = 5 * time.Second
		threshold   = 3
		openTimeout = time.Second
		inFlight    = 4
	)
	b := setupJetStream(t)
	var down atomic.Bool
	down.Store(true)
	var outageRequests atomic.Int32
	failing := newHits(t, func(w http.ResponseWriter, _ *http.Request) {
		if down.Load() {
			outageRequests.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }
	healthyA, healthyB := newHits(t, ok), newHits(t, ok)

	reg := prometheus.NewRegistry()
	sub := func(name, url string) consumer.Subscription {
		return consumer.Subscription{Name: name, FilterSubjects: []string{"events.>"}, URL: url, Secrets: []string{testSecret},
			BackOff: []time.Duration{100 * time.Millisecond}, MaxDeliver: 1000, MaxInFlight: inFlight, AllowPrivate: true,
			Ordering: consumer.OrderingNone, // in-flight deliveries to one endpoint, not one stream at a time
			Start:    consumer.Start{Policy: consumer.StartAll}}
	}
	q := b.startConsumer(t, consumer.Config{Registerer: reg,
		Breaker: breaker.Settings{ConsecutiveFailures: threshold, OpenTimeout: openTimeout, HalfOpenProbes: 1}},
		sub("healthy-a", healthyA.URL), sub("healthy-b", healthyB.URL), sub("failing", failing.URL))

	start := time.Now()
	b.publish(t, 1, events, 30)

	// The healthy endpoints are not held up by the failing one: they have
	// every event while it is still down.
	require.Eventually(t, func() bool {
		return healthyA.distinct() == events && healthyB.distinct() == events
	}, 90*time.Second, 20*time.Millisecond, "the healthy endpoints get every event during the outage")
	require.Eventually(t, func() bool { return breakerOpened(t, reg, failing.URL) }, 30*time.Second, 20*time.Millisecond,
		"the failing endpoint's breaker opened")
	// Tripped and still failing, it is open or half-open, never closed.
	require.NotEqual(t, breaker.Closed, breakerState(t, reg, failing.URL), "the failing endpoint's breaker stays tripped while it is down")
	if wait := minOutage - time.Since(start); wait > 0 {
		<-time.After(wait) // the scenario's length, not a wait for a condition: a few open timeouts, so probes are counted
	}
	outage := time.Since(start)
	down.Store(false)

	require.Eventually(t, func() bool { return failing.distinct() == events }, 90*time.Second, 50*time.Millisecond,
		"the failing endpoint gets every event after recovery")
	elapsed := time.Since(start)
	probes := int32(elapsed/openTimeout) + 1
	maxDuringOutage := threshold + (inFlight - 1) + probes
	require.LessOrEqual(t, outageRequests.Load(), maxDuringOutage,
		"requests during the outage: threshold %d + in flight %d + probes %d", threshold, inFlight-1, probes)
	require.GreaterOrEqual(t, outageRequests.Load(), int32(threshold), "the endpoint was tried before the breaker opened")
	t.Logf("failing endpoint: %d requests during the %s outage (bound %d), all %d events %s after the start", outageRequests.Load(), outage, maxDuringOutage, events, elapsed.Round(time.Millisecond))

	n, err := q.Count(b.ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "the outage alone dead-letters nothing")
	// Every subscription settled every event: the partitions' floors
	// passed their last events, nothing is left in retry.
	b.waitSettled(t, lastByPartition(1, events, 30, consumer.DefaultPartitions), 30*time.Second)
}

// breakerState returns the state of endpoint url's breaker as the gauge
// jsbridge_consumer_breaker_state in reg shows it.
func breakerState(t *testing.T, reg *prometheus.Registry, url string) breaker.State {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "jsbridge_consumer_breaker_state" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labels(m)["endpoint"] == breaker.Endpoint(url) {
				return breaker.State(m.GetGauge().GetValue())
			}
		}
	}
	t.Fatalf("no jsbridge_consumer_breaker_state for %s", breaker.Endpoint(url))
	return breaker.Closed
}

// breakerOpened reports whether the breaker of endpoint url went from
// closed to open at least once, from its transitions counter in reg.
func breakerOpened(t *testing.T, reg *prometheus.Registry, url string) bool {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "jsbridge_consumer_breaker_transitions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labels(m)["endpoint"] == breaker.Endpoint(url) && labels(m)["from"] == "closed" && labels(m)["to"] == "open" {
				return m.GetCounter().GetValue() >= 1
			}
		}
	}
	return false
}

func labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}
