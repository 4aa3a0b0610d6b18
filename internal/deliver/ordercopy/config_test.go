package ordercopy_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/wire"
)

// StreamConfig is the copy the consumer creates: sourced with the
// partition transform of the events stream's prefix, compressed, twice
// the events stream's limits (none for none), direct gets, and the
// events stream's replicas unless told.
func TestCopyStreamConfig(t *testing.T) {
	t.Parallel()
	t.Run("limits and a prefix", func(t *testing.T) {
		t.Parallel()
		events := jetstream.StreamConfig{Name: "APP", Subjects: []string{"app.events.>"}, MaxAge: time.Hour, MaxBytes: 1 << 30, Replicas: 3}
		cfg := ordercopy.StreamConfig(events, 8, 0)
		require.Equal(t, "APP_ORDERED", cfg.Name)
		require.Equal(t, jetstream.S2Compression, cfg.Compression)
		require.Equal(t, jetstream.LimitsPolicy, cfg.Retention)
		require.Equal(t, jetstream.FileStorage, cfg.Storage)
		require.True(t, cfg.AllowDirect)
		require.Equal(t, 2*time.Hour, cfg.MaxAge)
		require.Equal(t, int64(2<<30), cfg.MaxBytes)
		require.Equal(t, 3, cfg.Replicas, "the events stream's")
		require.Len(t, cfg.Sources, 1)
		src, dest := wire.OrderedTransform("app.events", 8)
		require.Equal(t, "APP", cfg.Sources[0].Name)
		require.Equal(t, []jetstream.SubjectTransformConfig{{Source: src, Destination: dest}}, cfg.Sources[0].SubjectTransforms)
	})
	t.Run("no limits", func(t *testing.T) {
		t.Parallel()
		cfg := ordercopy.StreamConfig(jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Replicas: 1}, 16, 3)
		require.Zero(t, cfg.MaxAge, "no MaxAge")
		require.Equal(t, int64(-1), cfg.MaxBytes, "no MaxBytes")
		require.Equal(t, 3, cfg.Replicas, "as told")
		src, _ := wire.OrderedTransform(wire.DefaultEventsPrefix, 16)
		require.Equal(t, src, cfg.Sources[0].SubjectTransforms[0].Source)
	})
}
