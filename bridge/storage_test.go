package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// JetStream's storage limit (max_file_store) is reached while the bridge
// drains: the refusals are an outage (no stream's retry count grows,
// nothing is blocked), Ready says so naming the cause within a few
// seconds and jsbridge_bus_unavailable{reason="storage"} is 1; once
// space is freed the bridge resumes by itself, Ready and the gauge clear,
// and JetStream holds every event once, each stream in order.
func TestStorageFullMidDrainIsAnOutageSaidAndResumed(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a JetStream store and waits for the bridge to resume")
	}
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.Migrate(ctx))
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{MaxFileStore: 2 << 20}))

	logs := &logBuffer{}
	reg := prometheus.NewRegistry()
	b, err := bridge.New(pool, js, bridge.Config{Schema: schema, PollInterval: 50 * time.Millisecond, Logger: logs.logger(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, b.Start(ctx))
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	gauge := func() float64 {
		return testutil.ToFloat64(collectorFor(t, reg, "jsbridge_bus_unavailable", `reason="storage"`))
	}
	require.Zero(t, gauge())

	const streams, before, during = 20, 5, 10
	appendAll := func(from, n int) {
		for s := range streams {
			for v := from; v < from+n; v++ {
				_, err := st.Append(ctx, fmt.Sprintf("order-%d", s), int64(v-1), store.NewEvent{Name: "Step", Data: fmt.Appendf(nil, `{"n":%d,"pad":"%s"}`, v, strings.Repeat("p", 200))})
				require.NoError(t, err)
			}
		}
	}
	appendAll(0, before)
	require.Eventually(t, func() bool { return jsCount(t, js, bridge.DefaultStream) == streams*before }, 30*time.Second, 20*time.Millisecond)

	// Another stream takes what is left of the store.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	pad := make([]byte, 32<<10)
	for i := 0; ; i++ {
		_, err := js.Publish(ctx, "filler.x", pad)
		if err != nil {
			require.True(t, forward.IsStorageFull(err), "filling the store: %v", err)
			break
		}
		require.Less(t, i, 1000, "the store never filled")
	}

	refused := time.Now()
	appendAll(before, during)
	require.Eventually(t, func() bool { return errorsIs(b.Ready(ctx), bridge.ErrStorageFull) }, 10*time.Second, 20*time.Millisecond, "Ready names the cause")
	t.Logf("Ready failed %s after the appends: %v", time.Since(refused).Round(time.Millisecond), b.Ready(ctx))
	require.ErrorContains(t, b.StorageErr(), "insufficient resources")
	require.Equal(t, 1.0, gauge())
	// Several cycles meet the refusal: still no retry counted, nothing blocked.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(collectorFor(t, reg, "jsbridge_bridge_publish_errors_total", `class="storage"`)) >= 3
	}, 60*time.Second, 50*time.Millisecond)
	infos, err := st.Streams(ctx, store.StreamFilter{})
	require.NoError(t, err)
	for _, i := range infos {
		require.Zero(t, i.Retry, "stream %s: an outage counts no retry", i.Stream)
		require.False(t, i.Blocked, "stream %s: %s", i.Stream, i.Error)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "JetStream refuses publishes for lack of storage"), "said once per outage")

	freed := time.Now()
	filler, err := js.Stream(ctx, "FILLER")
	require.NoError(t, err)
	require.NoError(t, filler.Purge(ctx))
	require.Eventually(t, func() bool { return jsCount(t, js, bridge.DefaultStream) == streams*(before+during) }, 90*time.Second, 50*time.Millisecond)
	t.Logf("every event stored %s after space was freed", time.Since(freed).Round(time.Millisecond))
	require.NoError(t, b.Ready(ctx))
	require.Zero(t, gauge())
	require.Contains(t, logs.String(), "JetStream stores the bridge's publishes again")

	versions, ids := jsEvents(t, js, bridge.DefaultStream)
	require.Len(t, ids, streams*(before+during))
	for id, n := range ids {
		require.Equal(t, 1, n, "event %s stored once", id)
	}
	for s := range streams {
		name := fmt.Sprintf("order-%d", s)
		require.Len(t, versions[name], before+during, name)
		for i, v := range versions[name] {
			require.EqualValues(t, i, v, "%s in order", name)
		}
	}
	infos, err = st.Streams(ctx, store.StreamFilter{})
	require.NoError(t, err)
	for _, i := range infos {
		require.Zero(t, i.Retry, i.Stream)
		require.False(t, i.Blocked, i.Stream)
	}
}

// collectorFor returns the metric of reg named name whose labels contain
// label (`reason="storage"`), as a collector testutil.ToFloat64 reads.
func collectorFor(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			if strings.Contains(strings.Join(ls, ","), label) {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
				return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return v })
			}
		}
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return 0 })
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
