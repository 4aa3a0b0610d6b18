package metrics_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/jsbridge/jsbridge/jsbridgetest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared/metrics"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
)

// A claim's end names its cause: a record lost first, else the claim
// context's cause.
func TestAReleaseNamesItsCause(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cause      error
		recordLost bool
		want       string
	}{
		{owner.ErrReleased, false, metrics.CauseRebalance},
		{owner.ErrStopping, false, metrics.CauseStopping},
		{context.Canceled, false, metrics.CauseLeaseLost},
		{owner.ErrStopping, true, metrics.CauseRecordLost},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(c.cause)
		require.Equal(t, c.want, metrics.ReleaseCause(ctx, c.recordLost), "%v", c.cause)
	}
}

// The gauges read the replica when scraped; hand-overs are counted by
// direction and cause; the bucket's writes by kind of key and result.
func TestTheReplicasMetricsCountWhatItDid(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	owned := 3
	m, err := metrics.New(reg, metrics.Sources{
		Owned: func() int { return owned },
		Cursors: func() []map[string]string {
			return []map[string]string{{"a": "behind", "b": "paused"}, {"a": "behind"}}
		},
	})
	require.NoError(t, err)
	m.Handover(true, metrics.CauseClaimed)
	m.Handover(false, metrics.CauseStopping)

	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	bucket, err := position.Bucket(t.Context(), js, "", 1)
	require.NoError(t, err)
	kv := m.KV(bucket)
	rev, err := kv.Create(t.Context(), position.Key(0), []byte("r"))
	require.NoError(t, err)
	_, err = kv.Update(t.Context(), position.Key(0), []byte("r"), rev+1) // a stale revision: refused
	require.Error(t, err)
	_, err = kv.Create(t.Context(), position.CursorKey("a", 0), []byte("c"))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), position.MembersKey(0, "TOKEN", 1), []byte("m"))
	require.NoError(t, err)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_cursors Subscriptions with a cursor on the partitions this replica serves, by state (behind, breaker, paused, disabled, held): one per subscription and partition.
# TYPE jsbridge_consumer_cursors gauge
jsbridge_consumer_cursors{state="behind"} 2
jsbridge_consumer_cursors{state="breaker"} 0
jsbridge_consumer_cursors{state="disabled"} 0
jsbridge_consumer_cursors{state="held"} 0
jsbridge_consumer_cursors{state="paused"} 1
# HELP jsbridge_consumer_shared_partitions_owned Partitions this replica holds the lease of (the shared engine).
# TYPE jsbridge_consumer_shared_partitions_owned gauge
jsbridge_consumer_shared_partitions_owned 3
`), "jsbridge_consumer_cursors", "jsbridge_consumer_shared_partitions_owned"))
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"key", "record", "result", "ok"}, 1}, {[]string{"key", "record", "result", "failed"}, 1},
		{[]string{"key", "cursor", "result", "ok"}, 1}, {[]string{"key", "members", "result", "ok"}, 1},
	} {
		require.Equal(t, c.want, promregtest.Value(t, reg, "jsbridge_consumer_position_commits_total", c.labels...), "%v", c.labels)
	}
	require.Equal(t, 1.0, promregtest.Value(t, reg, "jsbridge_consumer_shared_handovers_total", "cause", metrics.CauseClaimed, "direction", "gained"))
	require.Equal(t, 1.0, promregtest.Value(t, reg, "jsbridge_consumer_shared_handovers_total", "cause", metrics.CauseStopping, "direction", "released"))
}

// The streams gauges count the records' asides per subscription when
// scraped: parked (AsideParked), set aside (AsideStuck), a stream being
// read again in neither; each of the replica's subscriptions is shown,
// 0 without asides; in flight reads the senders' slots. Attempt hands a subscription's sender its children
// of the POST duration histogram and the rate limit gauge.
func TestStreamsGaugesCountTheRecordsAsides(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	asides := []position.Aside{
		{Sub: "orders", Stream: "order-1", State: fanout.AsideParked},
		{Sub: "orders", Stream: "order-2", State: fanout.AsideParked},
		{Sub: "orders", Stream: "order-3", State: fanout.AsideStuck},
		{Sub: "orders", Stream: "order-4", State: fanout.AsideReading},
	}
	m, err := metrics.New(reg, metrics.Sources{Owned: func() int { return 0 }, Cursors: func() []map[string]string { return nil },
		Asides:   func() ([]string, []position.Aside) { return []string{"orders", "audit"}, asides },
		InFlight: func() map[string]int { return map[string]int{"orders": 3} }})
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_streams_parked Ordered subscriptions: streams parked behind a dead-lettered event (on_dead_letter: park, or order-stuck), on the partitions this replica serves.
# TYPE jsbridge_consumer_streams_parked gauge
jsbridge_consumer_streams_parked{subscription="audit"} 0
jsbridge_consumer_streams_parked{subscription="orders"} 2
# HELP jsbridge_consumer_streams_set_aside Ordered subscriptions: streams set aside as stuck (their head retried in place while the shared read passes their later events), on the partitions this replica serves.
# TYPE jsbridge_consumer_streams_set_aside gauge
jsbridge_consumer_streams_set_aside{subscription="audit"} 0
jsbridge_consumer_streams_set_aside{subscription="orders"} 1
# HELP jsbridge_consumer_in_flight Webhook deliveries in progress on this replica (the subscription's max_in_flight slots taken), by subscription.
# TYPE jsbridge_consumer_in_flight gauge
jsbridge_consumer_in_flight{subscription="orders"} 3
`), "jsbridge_consumer_streams_parked", "jsbridge_consumer_streams_set_aside", "jsbridge_consumer_in_flight"))

	am := m.Attempt("orders", prometheus.NewCounterVec(prometheus.CounterOpts{Name: "d"}, []string{"subscription", "outcome", "status_class"}))
	am.Duration.Observe(0.2)
	am.Rate.Set(5)
	require.Equal(t, 1, testutil.CollectAndCount(reg, "jsbridge_consumer_attempt_duration_seconds"))
	require.Equal(t, 5.0, testutil.ToFloat64(am.Rate))
}

// The aside-age gauges show, when scraped, each subscription's oldest
// held-back event's age (+Inf for one gone from the events stream) and
// the events stream's MaxAge; a scrape that could not read the events
// stream has neither.
func TestAsideAgeGaugesReadTheReplicaWhenScraped(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	readable := true
	_, err := metrics.New(reg, metrics.Sources{Owned: func() int { return 0 }, Cursors: func() []map[string]string { return nil },
		AsideAges: func() (map[string]float64, float64, bool) {
			return map[string]float64{"orders": 90, "audit": 0, "billing": math.Inf(1)}, 604800, readable
		}})
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_events_max_age_seconds The events stream's MaxAge in seconds (0: none): a stream parked longer loses its held-back events.
# TYPE jsbridge_consumer_events_max_age_seconds gauge
jsbridge_consumer_events_max_age_seconds 604800
# HELP jsbridge_consumer_streams_aside_oldest_age_seconds Ordered subscriptions: the age in seconds of the oldest event a parked or set-aside stream holds back, on the partitions this replica serves (0: none; +Inf: the event is no longer in the events stream).
# TYPE jsbridge_consumer_streams_aside_oldest_age_seconds gauge
jsbridge_consumer_streams_aside_oldest_age_seconds{subscription="audit"} 0
jsbridge_consumer_streams_aside_oldest_age_seconds{subscription="billing"} +Inf
jsbridge_consumer_streams_aside_oldest_age_seconds{subscription="orders"} 90
`), "jsbridge_consumer_events_max_age_seconds", "jsbridge_consumer_streams_aside_oldest_age_seconds"))
	readable = false
	require.Zero(t, testutil.CollectAndCount(reg, "jsbridge_consumer_events_max_age_seconds", "jsbridge_consumer_streams_aside_oldest_age_seconds"))
}
