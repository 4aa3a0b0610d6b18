package seqtime_test

import (
	"testing"
	"time"

	"github.com/jsbridge/jsbridge/jsbridgetest"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/shared/seqtime"
)

func events(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	return js
}

func publish(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for range n {
		_, err := js.Publish(t.Context(), "events.order.order-1.Placed", []byte("{}"))
		require.NoError(t, err)
	}
}

// A time resolves to the last sequence stored before it; a time past the
// last message, or none, to the last sequence.
func TestATimeResolvesToTheSequenceBeforeIt(t *testing.T) {
	t.Parallel()
	js := events(t)
	f := seqtime.New(nil, js, "EVENTS")
	seq, err := f.Before(t.Context(), time.Time{})
	require.NoError(t, err)
	require.Zero(t, seq, "an empty stream")

	publish(t, js, 5)
	s, err := js.Stream(t.Context(), "EVENTS")
	require.NoError(t, err)
	for want := uint64(0); want < 5; want++ {
		m, err := s.GetMsg(t.Context(), want+1)
		require.NoError(t, err)
		seq, err := f.Before(t.Context(), m.Time)
		require.NoError(t, err)
		require.Equal(t, want, seq, "the time event %d was stored at", want+1)
	}
	seq, err = f.Before(t.Context(), time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, uint64(5), seq)
}

// The look at the tail is kept for Fresh on the Finder's clock, and
// Forget drops it.
func TestTheTailIsReadAgainOnceStaleOrForgotten(t *testing.T) {
	t.Parallel()
	js := events(t)
	clock := clockwork.NewFakeClockAt(time.Now())
	f := seqtime.New(base.New(clock, nil, ""), js, "EVENTS")
	publish(t, js, 2)
	seq, err := f.Before(t.Context(), time.Time{})
	require.NoError(t, err)
	require.Equal(t, uint64(2), seq)

	publish(t, js, 1)
	seq, err = f.Before(t.Context(), time.Time{})
	require.NoError(t, err)
	require.Equal(t, uint64(2), seq, "the tail read less than Fresh ago")

	clock.Advance(seqtime.Fresh + time.Millisecond)
	seq, err = f.Before(t.Context(), time.Time{})
	require.NoError(t, err)
	require.Equal(t, uint64(3), seq, "stale: read again")

	publish(t, js, 1)
	f.Forget()
	seq, err = f.Before(t.Context(), time.Time{})
	require.NoError(t, err)
	require.Equal(t, uint64(4), seq, "forgotten: read again")
}
