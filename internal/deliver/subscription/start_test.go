package subscription_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

func TestParseStartReadsWhatStringWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 1, 12, 30, 0, 500, time.UTC)
	for in, want := range map[string]subscription.Start{
		"":                                  {Policy: subscription.StartNew},
		"new":                               {Policy: subscription.StartNew},
		"all":                               {Policy: subscription.StartAll},
		"time:2026-11-01T12:30:00.0000005Z": subscription.StartAtTime(at),
		"time: 2026-11-01T13:30:00.0000005+01:00": subscription.StartAtTime(at.In(time.FixedZone("", 3600))),
		"sequence:42": subscription.StartAtSequence(42),
		"sequence: 7": subscription.StartAtSequence(7),
	} {
		got, err := subscription.ParseStart(in)
		require.NoError(t, err, in)
		require.Equal(t, want.Policy, got.Policy, in)
		require.True(t, want.Time.Equal(got.Time), in)
		require.Equal(t, want.Sequence, got.Sequence, in)
		again, err := subscription.ParseStart(got.String())
		require.NoError(t, err)
		require.Equal(t, got.String(), again.String())
	}
	for _, bad := range []string{"old", "time:yesterday", "sequence:0", "sequence:-1", "sequence", "time:"} {
		_, err := subscription.ParseStart(bad)
		require.ErrorIs(t, err, subscription.ErrInvalidStart, bad)
		require.ErrorContains(t, err, strconv.Quote(bad))
	}
	err := subscription.Subscription{Name: "s", FilterSubjects: []string{"events.>"}, URL: "https://h.example/", Secrets: []string{secret},
		Start: subscription.Start{Policy: subscription.StartSequence}}.Validate()
	require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
	require.ErrorContains(t, err, "Start")
}

// Start.validate, through Validate: a start that names a policy needs its
// argument, and an unknown policy is refused by name.
func TestValidateStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		start subscription.Start
		want  string
	}{
		{subscription.Start{Policy: subscription.StartTime}, "Start: time start without a time"},
		{subscription.Start{Policy: subscription.StartSequence}, "Start: sequence start at 0"},
		{subscription.Start{Policy: "latest"}, `Start: "latest" (want "new", "all", "time" or "sequence")`},
	} {
		s := sub("orders", "https://hooks.example/in")
		s.Start = tc.start
		err := s.Validate()
		require.ErrorIs(t, err, subscription.ErrInvalidSubscription, tc.want)
		require.ErrorContains(t, err, tc.want)
	}
	for _, ok := range []subscription.Start{{}, {Policy: subscription.StartAll}, subscription.StartAtTime(time.Unix(1, 0)), subscription.StartAtSequence(1)} {
		s := sub("orders", "https://hooks.example/in")
		s.Start = ok
		require.NoError(t, s.Validate(), ok.String())
	}
}
