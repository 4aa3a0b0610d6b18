package ordercopy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A held event's retention risk: none before 3/4 of the copy's MaxAge (or
// without one), near from there, removed from MaxAge on; the cause names
// the event, its age, the copy and its MaxAge.
func TestRetentionRisk(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		age, maxAge time.Duration
		want        Risk
	}{
		{0, time.Hour, RiskNone},
		{44 * time.Minute, time.Hour, RiskNone},
		{45 * time.Minute, time.Hour, RiskNear},
		{59 * time.Minute, time.Hour, RiskNear},
		{time.Hour, time.Hour, RiskRemoved},
		{48 * time.Hour, 0, RiskNone}, // no MaxAge: never removed by age
	} {
		require.Equal(t, tc.want, RiskOf(at, at.Add(tc.age), tc.maxAge), "age %s, MaxAge %s", tc.age, tc.maxAge)
	}
	require.Equal(t, RiskNone, RiskOf(time.Time{}, at, time.Hour), "no held event")

	near := RiskError(RiskNear, "EVENTS_ORDERED", "42", at, at.Add(50*time.Minute), time.Hour, "r1")
	require.Equal(t, "held event 42 is 50m0s old, past 3/4 of the partitioned copy EVENTS_ORDERED's MaxAge 1h0m0s: the copy removes it at MaxAge; "+
		"replay or skip the parked stream's head (consumer dlq), or raise the copy's MaxAge (nats stream edit EVENTS_ORDERED --max-age)", near)
	gone := RiskError(RiskRemoved, "EVENTS_ORDERED", "42", at, at.Add(2*time.Hour), time.Hour, "r1")
	require.Contains(t, gone, "held event 42 is 2h0m0s old, past the partitioned copy EVENTS_ORDERED's MaxAge 1h0m0s: the copy removed it")
	require.Contains(t, gone, "only while replica r1 holds it")
	require.Empty(t, RiskError(RiskNone, "EVENTS_ORDERED", "42", at, at, time.Hour, "r1"))
}
