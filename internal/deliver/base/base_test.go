package base_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
)

// New fills what it is not given: the real clock, a discarding logger,
// a valid replica id of this process.
func TestNewFillsTheDefaults(t *testing.T) {
	t.Parallel()
	a := base.New(nil, nil, "")
	require.NotNil(t, a.Clock)
	require.WithinDuration(t, time.Now(), a.Clock.Now(), time.Minute, "the real clock")
	require.NotNil(t, a.Logger)
	require.True(t, base.ValidReplica(a.Replica), "a valid replica id: %q", a.Replica)
	require.NotEqual(t, a.Replica, base.New(nil, nil, "").Replica, "a fresh id each time")
	require.Same(t, a, base.Default(a))
	require.Same(t, base.Default(nil), base.Default(nil), "one fallback per process")
	require.True(t, base.ValidReplica(base.Default(nil).Replica))

	clock := clockwork.NewFakeClock()
	b := base.New(clock, nil, "replica-a")
	require.Equal(t, clock.Now(), b.Clock.Now())
	require.Equal(t, "replica-a", b.Replica)
}

// With and WithReplica return copies: what a part passes on never
// changes the archetype it was given.
func TestWithCopies(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	a := base.New(clockwork.NewFakeClock(), slog.New(slog.NewTextHandler(&logs, nil)), "replica-a")
	p := a.With(slog.Int("partition", 3))
	p.Logger.Info("claimed")
	a.Logger.Info("started")
	require.Contains(t, logs.String(), "msg=claimed partition=3")
	require.Contains(t, logs.String(), "msg=started\n")
	require.Equal(t, a.Clock, p.Clock)
	require.Equal(t, "replica-a", p.Replica)

	r := a.WithReplica("records")
	require.Equal(t, "records", r.Replica)
	require.Equal(t, "replica-a", a.Replica)
	require.Equal(t, "replica-a", a.WithReplica("").Replica)
}

// Replica ids are KV key tokens.
func TestValidReplica(t *testing.T) {
	t.Parallel()
	require.True(t, base.ValidReplica("host-12_ab"))
	require.False(t, base.ValidReplica("a.b"))
	require.False(t, base.ValidReplica("a b"))
}
