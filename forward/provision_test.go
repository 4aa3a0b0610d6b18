package forward_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/forward"
)

func TestProvisionCreatesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.True(t, p.Created)
	require.Equal(t, "EVENTS", p.Name)
	require.Equal(t, []string{"events.>"}, p.Subjects)
	require.Equal(t, 2*time.Minute, p.DuplicateWindow)
	require.Empty(t, p.Warnings)

	s, err := b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, jetstream.FileStorage, info.Config.Storage)
	require.Equal(t, 2*time.Minute, info.Config.Duplicates)
	require.Equal(t, []string{"events.>"}, info.Config.Subjects)
	require.Equal(t, 1, info.Config.Replicas)
	require.True(t, info.Config.AllowDirect, "the consumer's readers read it back by direct gets")
	require.True(t, p.AllowDirect)

	again, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, 2*time.Minute, again.DuplicateWindow)
	require.Empty(t, again.Warnings)
	after, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, info.Created, after.Created)
}

func TestProvisionCustom(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{
		Name: "SHOP", Prefix: "acme.shop", DuplicateWindow: 10 * time.Minute, MaxMsgSize: 2048,
	})
	require.NoError(t, err)
	require.True(t, p.Created)
	s, err := b.js.Stream(t.Context(), "SHOP")
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.Equal(t, []string{"acme.shop.>"}, cfg.Subjects)
	require.Equal(t, 10*time.Minute, cfg.Duplicates)
	require.EqualValues(t, 2048, cfg.MaxMsgSize)
}

func TestProvisionWarnsOnShortDuplicateWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage, Duplicates: 30 * time.Second, AllowBatchPublish: true, AllowDirect: true,
	})
	require.NoError(t, err)

	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{DuplicateWindow: 5 * time.Minute})
	require.NoError(t, err)
	require.False(t, p.Created)
	require.Equal(t, 30*time.Second, p.DuplicateWindow)
	require.Len(t, p.Warnings, 1)
	require.Contains(t, p.Warnings[0], "DuplicateWindow")
	require.Contains(t, p.Warnings[0], "30s")
	require.Contains(t, p.Warnings[0], "5m0s")

	// The existing stream is left as it was.
	s, err := b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, s.CachedInfo().Config.Duplicates)
}

func TestProvisionWarnsOnMemoryStorage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.MemoryStorage, Duplicates: time.Hour, AllowBatchPublish: true, AllowDirect: true,
	})
	require.NoError(t, err)
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.Len(t, p.Warnings, 1)
	require.Contains(t, p.Warnings[0], "memory storage")
}

func TestProvisionWarnsWithoutBatchPublish(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Name: "CREATED", Prefix: "created"})
	require.NoError(t, err)
	require.True(t, p.Created)
	require.True(t, p.BatchPublish, "a created stream allows fast batches")

	_, err = b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage, Duplicates: time.Hour, AllowDirect: true,
	})
	require.NoError(t, err)
	p, err = forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.False(t, p.BatchPublish)
	require.Len(t, p.Warnings, 1)
	require.Contains(t, p.Warnings[0], `"allow_batched": true`)
}

func TestProvisionRejectsUncoveredSubjects(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.order.>", "other.>"}, Storage: jetstream.FileStorage,
	})
	require.NoError(t, err)
	_, err = forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.ErrorIs(t, err, forward.ErrSubjectsNotCovered)
	require.ErrorContains(t, err, `"events.>"`)
}

func TestProvisionAcceptsCoveringSubject(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"unrelated", "events.>"}, Storage: jetstream.FileStorage, Duplicates: time.Hour, AllowBatchPublish: true, AllowDirect: true,
	})
	require.NoError(t, err)
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.False(t, p.Created)
	require.Equal(t, []string{"unrelated", "events.>"}, p.Subjects)
	require.Empty(t, p.Warnings)
}

func TestProvisionValidates(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		cfg  forward.StreamConfig
		want string
	}{
		{forward.StreamConfig{Name: "A.B"}, `StreamConfig.Name "A.B"`},
		{forward.StreamConfig{Prefix: "events.*"}, "StreamConfig.Prefix"},
		{forward.StreamConfig{Prefix: ".events"}, "StreamConfig.Prefix"},
		{forward.StreamConfig{DuplicateWindow: -time.Second}, "StreamConfig.DuplicateWindow -1s"},
		{forward.StreamConfig{Replicas: -1}, "StreamConfig.Replicas -1"},
		{forward.StreamConfig{MaxMsgSize: -5}, "StreamConfig.MaxMsgSize -5"},
	} {
		_, err := forward.Provision(t.Context(), b.js, tc.cfg)
		require.ErrorIs(t, err, forward.ErrInvalidConfig)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := b.js.Stream(t.Context(), "EVENTS")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "nothing is created on invalid config")
}

// A created stream gets the limits asked for; an existing one keeps its
// own, reported in Provisioned.Limits with a warning, never changed.
func TestProvisionRetentionCreatedAndReportedNeverChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	lim := forward.Limits{MaxAge: 24 * time.Hour, MaxBytes: 1 << 30, MaxMsgsPerSubject: 5}
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Limits: lim})
	require.NoError(t, err)
	require.True(t, p.Created)
	require.Equal(t, lim, p.Limits)
	s, err := b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.Equal(t, 24*time.Hour, cfg.MaxAge)
	require.EqualValues(t, 1<<30, cfg.MaxBytes)
	require.EqualValues(t, 5, cfg.MaxMsgsPerSubject)
	require.Equal(t, jetstream.DiscardOld, cfg.Discard, "a limit never refuses a publish")

	again, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Limits: forward.Limits{MaxAge: time.Hour}})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, lim, again.Limits, "the stream's own")
	require.Len(t, again.Warnings, 1)
	require.Contains(t, again.Warnings[0], "retention max_age=24h0m0s max_bytes=1073741824 max_msgs_per_subject=5, not the max_age=1h0m0s max_bytes=none max_msgs_per_subject=none asked for")
	after, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, after.Config.MaxAge, "unchanged")

	_, err = forward.Provision(t.Context(), b.js, forward.StreamConfig{Limits: forward.Limits{MaxBytes: -1}})
	require.ErrorIs(t, err, forward.ErrInvalidConfig)
	require.ErrorContains(t, err, "StreamConfig.Limits.MaxBytes -1")
}

// Compress creates the stream with S2 compression; an existing stream
// without it is reported when compression is asked for, never changed.
func TestProvisionCompressionCreatedAndReportedNeverChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Name: "ZIPPED", Prefix: "zipped", Compress: true})
	require.NoError(t, err)
	require.True(t, p.Created)
	require.True(t, p.Compressed)
	s, err := b.js.Stream(t.Context(), "ZIPPED")
	require.NoError(t, err)
	require.Equal(t, jetstream.S2Compression, s.CachedInfo().Config.Compression)

	p, err = forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.False(t, p.Compressed, "not asked for: none")
	again, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Compress: true})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.False(t, again.Compressed, "the stream's own")
	require.Len(t, again.Warnings, 1)
	require.Contains(t, again.Warnings[0], "JetStream stream EVENTS is not compressed, and compression was asked for; it is left as it is")
	require.Contains(t, again.Warnings[0], "nats stream edit EVENTS --compression s2")
	s, err = b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	require.Equal(t, jetstream.NoCompression, s.CachedInfo().Config.Compression, "unchanged")
}

// A created stream answers direct gets; an existing one without
// AllowDirect is reported (naming the stream and the command that turns
// it on) and left as it is.
func TestProvisionAllowDirectCreatedAndReportedNeverChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage, Duplicates: time.Hour, AllowBatchPublish: true,
	})
	require.NoError(t, err)
	p, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.False(t, p.Created)
	require.False(t, p.AllowDirect, "the stream's own")
	require.Len(t, p.Warnings, 1)
	require.Contains(t, p.Warnings[0], "JetStream stream EVENTS does not allow direct gets (allow_direct)")
	require.Contains(t, p.Warnings[0], "nats stream edit EVENTS --allow-direct")
	s, err := b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.False(t, info.Config.AllowDirect, "unchanged")

	// Turned on as the warning says (the nats CLI's edit is a stream
	// update), the warning goes.
	cfg := info.Config
	cfg.AllowDirect = true
	_, err = b.js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	p, err = forward.Provision(t.Context(), b.js, forward.StreamConfig{})
	require.NoError(t, err)
	require.True(t, p.AllowDirect)
	require.Empty(t, p.Warnings)
}
