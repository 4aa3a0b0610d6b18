package deliver_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/wire"
)

// The partitioned copy's sourcing under a full store (max_file_store
// reached): events stored in EVENTS but not sourced yet stay out of the
// copy while JetStream refuses its writes, the copy lag gauges show them,
// and once space is freed the copy takes each once, in order, and ordered
// delivery resumes by itself (no restart, nothing lost or delivered
// twice). The events are held out of the copy (its source removed) while
// they are published and the store filled, so that every one of them meets
// a full store.
func TestOrderedCopyUnderAFullStoreCatchesUpOnceRoomIsMade(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a JetStream store")
	}
	t.Parallel()
	b := &orderedBundle{bundle: setupSmallStore(t, 2<<20), events: map[string]orderedEvent{}, nextID: 1}
	rc := newOrderedReceiver(t, b, func(orderedEvent, int) int { return http.StatusNoContent })
	reg := prometheus.NewRegistry()
	logs := &syncLog{}
	b.runOrdered(t, deliver.Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(logs, nil))}, orderedSub("full", rc.URL))
	copyName := wire.OrderedStream("EVENTS")
	gauge := func(name string) float64 {
		v, _ := gaugeOf(reg, name, "stream", copyName)
		return v
	}
	b.publishStream(t, "order-1", 0, 3)
	require.Eventually(t, func() bool { return len(rc.accepted()["order-1"]) == 3 }, 20*time.Second, 10*time.Millisecond)

	// Hold the sourcing back, store ten events, fill the store, then let
	// the copy source again: every write of it is refused.
	s, err := b.js.Stream(b.ctx, copyName)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	sources := cfg.Sources
	cfg.Sources = nil
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	b.publishStream(t, "order-1", 3, 8)
	b.publishStream(t, "order-2", 0, 5)
	filler := fillStore(t, b.bundle)
	cfg.Sources = sources
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 10 && gauge("jsbridge_consumer_ordered_copy_lag_seconds") > 0
	}, 15*time.Second, 20*time.Millisecond, "the lag shows the ten events not sourced")
	// The copy is refused: a while later it still holds the first three.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		info, err := s.Info(b.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, info.State.Msgs, "the copy stores nothing while the store is full")
		require.EqualValues(t, 10, gauge("jsbridge_consumer_ordered_copy_lag_messages"))
		time.Sleep(100 * time.Millisecond)
	}
	require.Len(t, rc.accepted()["order-1"], 3, "nothing more delivered")
	require.Empty(t, rc.accepted()["order-2"])

	// Room made: the copy takes the ten events once, in order, and
	// delivery resumes.
	freed := time.Now()
	require.NoError(t, filler.Purge(b.ctx))
	require.Eventually(t, func() bool {
		acc := rc.accepted()
		return len(acc["order-1"]) >= 8 && len(acc["order-2"]) >= 5
	}, 60*time.Second, 20*time.Millisecond, "ordered delivery resumed")
	t.Logf("delivery resumed %s after space was freed", time.Since(freed).Round(time.Millisecond))
	acc := rc.accepted()
	requireInOrder(t, map[string][]int64{"order-1": acc["order-1"]}, []string{"order-1"}, 8)
	requireInOrder(t, map[string][]int64{"order-2": acc["order-2"]}, []string{"order-2"}, 5)
	require.Eventually(t, func() bool {
		return gauge("jsbridge_consumer_ordered_copy_lag_messages") == 0 && gauge("jsbridge_consumer_ordered_copy_lag_seconds") == 0
	}, 15*time.Second, 20*time.Millisecond, "caught up")

	// The lease writes refused meanwhile are warned about once a minute
	// each, not at every try.
	for _, msg := range []string{"claiming a partition lease failed", "membership heartbeat failed", "renewing a partition lease failed"} {
		require.LessOrEqual(t, strings.Count(logs.String(), `level=WARN msg="`+msg+`"`), 1, "%s:\n%s", msg, logs.String())
	}
	require.Contains(t, logs.String(), "insufficient resources", "the refusal is said")

	// Each event in the copy once, in the events stream's order.
	info, err := s.Info(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 13, info.State.Msgs, "13 events, none twice")
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(b.ctx, seq)
		require.NoError(t, err)
		require.Equal(t, seq, wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo)), "copy message %d comes from EVENTS %d", seq, seq)
	}
}
