package bridgemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

func setup(t *testing.T) (*bridgemetrics.Metrics, *prometheus.Registry, *store.Store) {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	st, err := store.New(pool, store.WithSchema(jsbridgetest.Schema(t, pool)))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))
	reg := prometheus.NewRegistry()
	m, err := bridgemetrics.New(reg, st.Backlog, nil)
	require.NoError(t, err)
	return m, reg, st
}

func TestObserversCountWhatTheyAreTold(t *testing.T) {
	t.Parallel()
	m, reg, _ := setup(t)
	m.Published(forward.Outcome{Status: forward.Stored}, time.Millisecond)
	m.Published(forward.Outcome{Status: forward.Duplicate}, time.Millisecond)
	m.Published(forward.Outcome{Status: forward.Failed, Err: forward.ErrTooLarge}, time.Millisecond)
	m.Claimed(3, time.Millisecond, nil)
	m.Claimed(0, time.Millisecond, errors.New("db down"))
	m.Settled("order-1", drain.SettledAcked, 5, time.Millisecond)
	m.Settled("order-2", drain.SettledBlocked, 1, time.Millisecond)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_bridge_duplicates_total Publishes JetStream reported as duplicates (same Nats-Msg-Id inside the duplicate window) and dropped.
# TYPE jsbridge_bridge_duplicates_total counter
jsbridge_bridge_duplicates_total 1
# HELP jsbridge_bridge_events_forwarded_total Events forwarded to JetStream whose stream's watermark this bridge advanced past them (stored or reported duplicate).
# TYPE jsbridge_bridge_events_forwarded_total counter
jsbridge_bridge_events_forwarded_total 6
# HELP jsbridge_bridge_streams_claimed_total Streams this bridge claimed under lease.
# TYPE jsbridge_bridge_streams_claimed_total counter
jsbridge_bridge_streams_claimed_total 3
# HELP jsbridge_bridge_claim_errors_total Claims that failed (Postgres unreachable or erroring).
# TYPE jsbridge_bridge_claim_errors_total counter
jsbridge_bridge_claim_errors_total 1
`), "jsbridge_bridge_duplicates_total", "jsbridge_bridge_events_forwarded_total",
		"jsbridge_bridge_streams_claimed_total", "jsbridge_bridge_claim_errors_total"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			if h := mt.GetHistogram(); h != nil {
				counts[mf.GetName()] = h.GetSampleCount()
			}
			if mf.GetName() == "jsbridge_bridge_publish_errors_total" {
				require.Equal(t, "too_large", mt.GetLabel()[0].GetValue())
			}
		}
	}
	require.Equal(t, map[string]uint64{
		"jsbridge_bridge_claim_duration_seconds":   2,
		"jsbridge_bridge_publish_duration_seconds": 3,
		"jsbridge_bridge_ack_duration_seconds":     1,
	}, counts)
}

func TestPublishAndSettleOutcomesReadZeroFromStartUp(t *testing.T) {
	t.Parallel()
	m, reg, _ := setup(t)
	require.Equal(t, 4, testutil.CollectAndCount(reg, "jsbridge_bridge_publishes_total"))
	require.Equal(t, 6, testutil.CollectAndCount(reg, "jsbridge_bridge_streams_settled_total"))
	m.Published(forward.Outcome{Status: forward.AlreadyStored}, time.Millisecond)
	m.Settled("order-1", drain.SettledLeaseLost, 0, time.Millisecond)
	m.Settled("order-1", "not-a-how", 0, time.Millisecond)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_bridge_publishes_total Publish attempts by status: stored, duplicate or failed.
# TYPE jsbridge_bridge_publishes_total counter
jsbridge_bridge_publishes_total{status="already_stored"} 1
jsbridge_bridge_publishes_total{status="duplicate"} 0
jsbridge_bridge_publishes_total{status="failed"} 0
jsbridge_bridge_publishes_total{status="stored"} 0
# HELP jsbridge_bridge_streams_settled_total Claimed streams settled, by how: acked, retried, blocked, released, lease_lost, error.
# TYPE jsbridge_bridge_streams_settled_total counter
jsbridge_bridge_streams_settled_total{how="acked"} 0
jsbridge_bridge_streams_settled_total{how="blocked"} 0
jsbridge_bridge_streams_settled_total{how="error"} 0
jsbridge_bridge_streams_settled_total{how="lease_lost"} 1
jsbridge_bridge_streams_settled_total{how="not-a-how"} 1
jsbridge_bridge_streams_settled_total{how="released"} 0
jsbridge_bridge_streams_settled_total{how="retried"} 0
`), "jsbridge_bridge_publishes_total", "jsbridge_bridge_streams_settled_total"))
}

func TestBacklogGaugesComeFromPostgres(t *testing.T) {
	t.Parallel()
	_, reg, st := setup(t)
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("%s not exported", name)
		return 0
	}
	require.Zero(t, gauge("jsbridge_bridge_streams_blocked"), "starts at 0")
	require.Zero(t, gauge("jsbridge_bridge_oldest_unforwarded_event_age_seconds"))

	_, err := st.Append(t.Context(), "order-1", store.NoStream, store.NewEvent{Name: "E", Data: []byte(`{}`)})
	require.NoError(t, err)
	_, err = st.Append(t.Context(), "order-2", store.NoStream, store.NewEvent{Name: "E", Data: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, 2.0, gauge("jsbridge_bridge_streams_lagging"))
	_, err = st.Claim(t.Context(), "a", 1, time.Minute)
	require.NoError(t, err)
	infos, err := st.Streams(t.Context(), store.StreamFilter{})
	require.NoError(t, err)
	var held string
	for _, i := range infos {
		if i.LeasedBy == "a" {
			held = i.Stream
		}
	}
	require.NoError(t, st.Block(t.Context(), "a", held, -1, 0, "poison"))
	require.Equal(t, 1.0, gauge("jsbridge_bridge_streams_blocked"))
	require.Equal(t, 1.0, gauge("jsbridge_bridge_streams_lagging"))
	require.Positive(t, gauge("jsbridge_bridge_oldest_unforwarded_event_age_seconds"))
}

func TestNewRejectsMissingParts(t *testing.T) {
	t.Parallel()
	_, err := bridgemetrics.New(prometheus.NewRegistry(), nil, nil)
	require.Error(t, err)
}

// A publish the cycle's deadline cut short is counted under class timeout,
// one cut by shutdown under canceled.
func TestPublishErrorClassOfACutPublish(t *testing.T) {
	t.Parallel()
	m, reg, _ := setup(t)
	cut := drain.Unavailable(fmt.Errorf("publish events 1..3 of stream %q: no PubAck for the batch before the cycle's deadline: %w", "order-1", context.DeadlineExceeded))
	m.Published(forward.Outcome{Status: forward.Failed, Err: cut, Retryable: true}, time.Second)
	m.Published(forward.Outcome{Status: forward.Failed, Err: drain.Unavailable(context.Canceled), Retryable: true}, time.Second)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_bridge_publish_errors_total Failed publishes by class: too_large and invalid_data (non-retryable, the stream blocks), timeout (also cut by the cycle's deadline), canceled (cut by shutdown), no_responders, connection, storage (JetStream unavailable, or refusing for lack of storage: the stream backs off, counts no retry, never blocks), conflict, not_attempted (after an earlier failure in the stream), other.
# TYPE jsbridge_bridge_publish_errors_total counter
jsbridge_bridge_publish_errors_total{class="canceled"} 1
jsbridge_bridge_publish_errors_total{class="timeout"} 1
`), "jsbridge_bridge_publish_errors_total"))
}

func TestAuditKeepsTheLastCompletedRound(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a, err := bridgemetrics.NewAudit(reg)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_bridge_audit_last_run_timestamp_seconds Unix time the last completed verify round ended (0: none yet).
# TYPE jsbridge_bridge_audit_last_run_timestamp_seconds gauge
jsbridge_bridge_audit_last_run_timestamp_seconds 0
`), "jsbridge_bridge_audit_last_run_timestamp_seconds"), "no round yet")

	end := time.Unix(1_800_000_000, 500_000_000)
	a.Completed(bridgemetrics.AuditRound{Events: 100, Missing: 2, Duplicates: 1, OutOfOrder: 3, ContentDiffers: 4, Repaired: 5,
		Duration: 1500 * time.Millisecond, End: end})
	a.Failed()
	a.Completed(bridgemetrics.AuditRound{Events: 50, Duration: time.Second, End: end.Add(time.Minute)})
	a.Completed(bridgemetrics.AuditRound{Events: 50, Missing: 1, OutOfOrder: 2, Duration: 2 * time.Second, End: end.Add(2 * time.Minute)})
	a.Failed()

	want := `
# HELP jsbridge_bridge_audit_content_differs Events whose stored message differs from what Postgres holds (data, subject or headers), found by the last completed verify round.
# TYPE jsbridge_bridge_audit_content_differs gauge
jsbridge_bridge_audit_content_differs 0
# HELP jsbridge_bridge_audit_duplicates Extra copies of events JetStream stores, found by the last completed verify round.
# TYPE jsbridge_bridge_audit_duplicates gauge
jsbridge_bridge_audit_duplicates 0
# HELP jsbridge_bridge_audit_events_checked_total Postgres events compared with JetStream by completed verify rounds.
# TYPE jsbridge_bridge_audit_events_checked_total counter
jsbridge_bridge_audit_events_checked_total 200
# HELP jsbridge_bridge_audit_last_run_duration_seconds Duration of the last completed verify round.
# TYPE jsbridge_bridge_audit_last_run_duration_seconds gauge
jsbridge_bridge_audit_last_run_duration_seconds 2
# HELP jsbridge_bridge_audit_last_run_timestamp_seconds Unix time the last completed verify round ended (0: none yet).
# TYPE jsbridge_bridge_audit_last_run_timestamp_seconds gauge
jsbridge_bridge_audit_last_run_timestamp_seconds 1.8000001205e+09
# HELP jsbridge_bridge_audit_missing Forwarded events JetStream does not hold, as the last completed verify round left them (after --repair).
# TYPE jsbridge_bridge_audit_missing gauge
jsbridge_bridge_audit_missing 1
# HELP jsbridge_bridge_audit_out_of_order Events JetStream stores after a later version of their stream, found by the last completed verify round.
# TYPE jsbridge_bridge_audit_out_of_order gauge
jsbridge_bridge_audit_out_of_order 2
# HELP jsbridge_bridge_audit_repaired_total Missing events verify --repair re-published.
# TYPE jsbridge_bridge_audit_repaired_total counter
jsbridge_bridge_audit_repaired_total 5
# HELP jsbridge_bridge_audit_rounds_total Verify rounds by result: clean, problems, failed (not completed).
# TYPE jsbridge_bridge_audit_rounds_total counter
jsbridge_bridge_audit_rounds_total{result="clean"} 1
jsbridge_bridge_audit_rounds_total{result="failed"} 2
jsbridge_bridge_audit_rounds_total{result="problems"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}
