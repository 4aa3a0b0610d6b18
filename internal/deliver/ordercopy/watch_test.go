package ordercopy_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// The watch reads the copy at once and then every Every of its clock: the
// lag gauges by copy stream (0 once the copy sourced every event), and
// the copy's MaxAge, again after an operator changed it.
func TestWatchReadsTheCopysLagAndMaxAge(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	events, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, MaxAge: time.Hour})
	require.NoError(t, err)
	_, err = ordercopy.Provision(ctx, js, events, 4, 1, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	for range 3 {
		_, err := js.Publish(ctx, "events.order.order-1.OrderNoted", []byte("{}"))
		require.NoError(t, err)
	}
	copyName := wire.OrderedStream("EVENTS")
	cp, err := js.Stream(ctx, copyName)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cp.Info(ctx)
		return err == nil && info.State.Msgs == 3
	}, 10*time.Second, 10*time.Millisecond, "sourced into the copy")

	clock := clockwork.NewFakeClock()
	msgs := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lag_messages"}, []string{"stream"})
	secs := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lag_seconds"}, []string{"stream"})
	var maxAge atomic.Int64
	w := &ordercopy.Watch{JS: js, Events: "EVENTS", Every: time.Second, Clock: clock, Logger: slog.New(slog.DiscardHandler),
		LagMessages: msgs, LagSeconds: secs, MaxAge: &maxAge}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })

	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the first read done, waiting for the next")
	require.Equal(t, 2*time.Hour, time.Duration(maxAge.Load()))
	require.Equal(t, 1, testutil.CollectAndCount(msgs), "one copy stream")
	require.Zero(t, testutil.ToFloat64(msgs.WithLabelValues(copyName)), "caught up")
	require.Zero(t, testutil.ToFloat64(secs.WithLabelValues(copyName)))

	cfg := cp.CachedInfo().Config
	cfg.MaxAge = 3 * time.Hour
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	clock.Advance(time.Second)
	require.Eventually(t, func() bool { return time.Duration(maxAge.Load()) == 3*time.Hour }, 10*time.Second, 5*time.Millisecond,
		"the operator's MaxAge, read at the next tick")
}
