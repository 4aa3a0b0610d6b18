package deliver_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
)

// Removing a subscription from a running Fleet deletes its series from
// every metric labelled by subscription (read from the registry); the
// other subscription's stay, and a subscription added again under the
// name gets fresh ones.
func TestFleetRemoveDeletesTheSubscriptionsMetricSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an ordered subscription on an embedded JetStream")
	}
	t.Parallel()
	b := setupOrdered(t)
	rc := newReceiver(t, status(http.StatusOK))
	reg := prometheus.NewRegistry()
	f, err := deliver.NewFleet(b.js, deliver.Config{Registerer: reg, Partitions: 4, LeaseTTL: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	gone := orderedSub("gone", rc.URL)
	gone.RateLimit = 100
	require.NoError(t, f.Put(gone))
	require.NoError(t, f.Put(sub("kept", rc.URL)))
	for v := range int64(3) {
		b.publish(t, "order-1", v, "OrderPlaced")
	}
	rc.waitFor(t, 6)
	// Every per-subscription metric has a series of "gone" by now (the
	// ordered ones once its partitions are owned).
	want := []string{
		"jsbridge_consumer_deliveries_total", "jsbridge_consumer_attempt_duration_seconds", "jsbridge_consumer_in_flight",
		"jsbridge_consumer_rate_limit", "jsbridge_consumer_endpoint_disabled", "jsbridge_consumer_partitions_owned",
		"jsbridge_consumer_handovers_total",
	}
	require.Eventually(t, func() bool {
		have := seriesOf(t, reg, "gone")
		for _, m := range want {
			if !have[m] {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "series of subscription gone")

	require.NoError(t, f.Remove(b.ctx, "gone"))
	require.Empty(t, seriesOf(t, reg, "gone"), "no series of a removed subscription")
	kept := seriesOf(t, reg, "kept")
	require.True(t, kept["jsbridge_consumer_deliveries_total"] && kept["jsbridge_consumer_endpoint_disabled"], "the other subscription's series stay: %v", kept)

	// Added again: its series come back.
	require.NoError(t, f.Put(gone))
	require.Eventually(t, func() bool { return seriesOf(t, reg, "gone")["jsbridge_consumer_endpoint_disabled"] }, 5*time.Second, 10*time.Millisecond)
}

// seriesOf returns the metric families of reg holding a series labelled
// subscription=name.
func seriesOf(t *testing.T, reg *prometheus.Registry, name string) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "subscription" && l.GetValue() == name {
					out[mf.GetName()] = true
				}
			}
		}
	}
	return out
}
