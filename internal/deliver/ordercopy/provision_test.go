package ordercopy_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// Provision creates the copy once (a second call finds it and keeps it),
// turns AllowDirect on for a copy made without it and reports, without
// changing, a copy that keeps less than a new one would; it refuses a
// copy with another partition count and one that sourced an events
// stream created again since, naming the copy to delete.
func TestProvisionCreatesOrChecksTheCopy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	ecfg := jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, MaxAge: time.Hour}
	events, err := js.CreateStream(ctx, ecfg)
	require.NoError(t, err)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	copyName := wire.OrderedStream("EVENTS")

	maxAge, err := ordercopy.Provision(ctx, js, events, 4, 1, log)
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, maxAge, "a new copy keeps twice the events stream's MaxAge")
	s, err := js.Stream(ctx, copyName)
	require.NoError(t, err)
	require.Equal(t, ordercopy.StreamConfig(ecfg, 4, 1).Sources, s.CachedInfo().Config.Sources)

	_, err = ordercopy.Provision(ctx, js, events, 8, 1, log)
	require.ErrorIs(t, err, ordercopy.ErrPartitionsChanged)
	require.ErrorContains(t, err, "nats stream rm "+copyName)

	// An operator's copy: no direct gets, half the retention.
	cfg := s.CachedInfo().Config
	cfg.AllowDirect, cfg.MaxAge = false, 30*time.Minute
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	maxAge, err = ordercopy.Provision(ctx, js, events, 4, 1, log)
	require.NoError(t, err)
	require.Equal(t, 30*time.Minute, maxAge, "the existing copy's, left as it is")
	s, err = js.Stream(ctx, copyName)
	require.NoError(t, err)
	require.True(t, s.CachedInfo().Config.AllowDirect, "turned on")
	require.Contains(t, logs.String(), "the partitioned copy keeps messages for less than twice the events stream's MaxAge")

	// The events stream deleted and created again under a copy that
	// sourced three of its events.
	for range 3 {
		_, err := js.Publish(ctx, "events.order.order-1.OrderNoted", []byte("{}"))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 3
	}, 10*time.Second, 10*time.Millisecond, "sourced into the copy")
	require.NoError(t, js.DeleteStream(ctx, "EVENTS"))
	events, err = js.CreateStream(ctx, ecfg)
	require.NoError(t, err)
	_, err = ordercopy.Provision(ctx, js, events, 4, 1, log)
	require.ErrorIs(t, err, ordercopy.ErrEventsRecreated)
	require.ErrorContains(t, err, "nats stream rm "+copyName)
}
