package forward_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/forward"
)

// SetLimits changes an existing stream's retention, which Provision only
// reports, keeps its other settings, and JetStream applies the new limits
// at once.
func TestSetLimitsChangesAnExistingStream(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{stream: &forward.StreamConfig{Compress: true}})
	for i := range 5 {
		_, err := b.js.Publish(t.Context(), "events.order.order-1.OrderNoted", []byte(`{}`), jetstream.WithMsgID(string(rune('a'+i))))
		require.NoError(t, err)
	}

	want := forward.Limits{MaxAge: 7 * 24 * time.Hour, MaxMsgsPerSubject: 2}
	old, err := forward.SetLimits(t.Context(), b.js, "EVENTS", want)
	require.NoError(t, err)
	require.Equal(t, forward.Limits{}, old)
	s, err := b.js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, want, forward.LimitsOf(info.Config))
	require.Equal(t, jetstream.S2Compression, info.Config.Compression, "other settings kept")
	require.Equal(t, []string{"events.>"}, info.Config.Subjects)
	require.EqualValues(t, 2, info.State.Msgs, "the new per-subject limit applies at once")

	again, err := forward.SetLimits(t.Context(), b.js, "EVENTS", forward.Limits{})
	require.NoError(t, err)
	require.Equal(t, want, again)
	info, err = s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, forward.Limits{}, forward.LimitsOf(info.Config), "back to none")

	_, err = forward.SetLimits(t.Context(), b.js, "EVENTS", forward.Limits{MaxAge: time.Minute})
	require.ErrorIs(t, err, forward.ErrInvalidConfig)
	require.ErrorContains(t, err, "max age 1m0s is shorter than JetStream stream EVENTS's duplicate window 2m0s")
	_, err = forward.SetLimits(t.Context(), b.js, "EVENTS", forward.Limits{MaxBytes: -1})
	require.ErrorContains(t, err, "Limits.MaxBytes -1 is negative")
	_, err = forward.SetLimits(t.Context(), b.js, "NOPE", want)
	require.ErrorIs(t, err, forward.ErrStreamNotFound)
}
