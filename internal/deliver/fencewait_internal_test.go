package deliver

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/park"
)

// infoConsumer is a partition consumer whose Info answers info.
type infoConsumer struct {
	jetstream.Consumer
	mu   sync.Mutex
	info jetstream.ConsumerInfo
}

func (c *infoConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	info := c.info
	return &info, nil
}

// syncBuffer is a log sink safe for the partition's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A fence held open by an event pending on the consumer that nobody has in
// hand says so after fenceWaitWarnEvery, with the consumer's counts beside
// what is in hand, then again every fenceWaitWarnEvery, not on every check.
func TestAFenceHeldOpenLogsWhyItWaits(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var logs syncBuffer
	cons := &infoConsumer{info: jetstream.ConsumerInfo{
		NumAckPending: 3, NumWaiting: 1, NumPending: 40,
		AckFloor:       jetstream.SequenceInfo{Stream: 100, Consumer: 90},
		Delivered:      jetstream.SequenceInfo{Stream: 103, Consumer: 95},
		PriorityGroups: []jetstream.PriorityGroupState{{Group: partitionGroup, PinnedClientID: "pin-1", PinnedTS: clock.Now()}},
	}}
	pt := newPartition(partitionDeps{clock: clock, log: slog.New(slog.NewTextHandler(&logs, nil))}, 3, cons, 0, time.Time{})
	t.Cleanup(pt.cancel)
	pt.parking = park.New(park.Config{}, park.Deps{})
	pt.fenceGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fence_waiting_seconds"})
	var fence fenceBuffer
	// Two of the three pending events are in the fence; the third (101)
	// never arrives.
	fence.add(newFakeMsg("a", 2, 102))
	fence.add(newFakeMsg("b", 0, 103))

	warns := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "partition fence still waiting") {
				out = append(out, l)
			}
		}
		return out
	}
	check := func() {
		t.Helper()
		_, ok := pt.fenceReady(&fence)
		require.False(t, ok, "the fence passed with an event pending nobody has")
	}
	for range 10 { // checks every fenceCheck for 2 s: no WARN yet
		check()
		clock.Advance(fenceCheck)
	}
	require.Empty(t, warns())

	clock.Advance(fenceWaitWarnEvery)
	check()
	require.Len(t, warns(), 1)
	w := warns()[0]
	for _, want := range []string{
		"level=WARN", "partition=3", "waited=32s", "num_ack_pending=3", "in_hand=2", "in_fence=2", "in_lanes=0",
		"waiting=0", "held=0", "acking=0", "streams_aside=0", "ack_floor_stream=100", "ack_floor_consumer=90",
		"delivered_stream=103", "delivered_consumer=95", "num_waiting=1", "num_pending=40", "pinned_client=pin-1", "pinned_for=32s",
	} {
		require.Contains(t, w, want)
	}

	clock.Advance(fenceWaitWarnEvery / 2)
	check()
	require.Len(t, warns(), 1, "logged again before fenceWaitWarnEvery passed")
	clock.Advance(fenceWaitWarnEvery / 2)
	check()
	require.Len(t, warns(), 2)
	require.Contains(t, warns()[1], "waited=1m2s")
	require.Equal(t, 62.0, testutil.ToFloat64(pt.fenceGauge), "jsbridge_consumer_partition_fence_waiting_seconds")

	// The lost event arrives: the fence may pass (the park state read is
	// the run loop's next step, not this test's), and the wait ends.
	require.Equal(t, 62*time.Second, pt.fenceWait.passed(clock.Now()))
	_, due := pt.fenceWait.due(clock.Now().Add(time.Hour))
	require.False(t, due, "a passed fence still counted as waiting")
}
