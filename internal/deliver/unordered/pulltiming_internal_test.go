package unordered

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Outside a Fleet and in a small one, pulls keep the 2 s heartbeat and
// nats.go's 30 s expiry; a large Fleet stretches the heartbeat to keep
// about fleetHeartbeatRate a second, up to 30 s, with an expiry of four
// heartbeats; nats.go's rule (heartbeat at most half the expiry) holds.
func TestPullTimingStretchesWithTheFleet(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		units     int
		hb, expir time.Duration
	}{
		{0, 2 * time.Second, 30 * time.Second},
		{1, 2 * time.Second, 30 * time.Second},
		{400, 2 * time.Second, 30 * time.Second},
		{1000, 5 * time.Second, 30 * time.Second},
		{2000, 10 * time.Second, 40 * time.Second},
		{10_000, 30 * time.Second, 2 * time.Minute},
		{100_000, 30 * time.Second, 2 * time.Minute},
	} {
		hb, expiry := pullTiming(tc.units)
		require.Equal(t, tc.hb, hb, "heartbeat at %d units", tc.units)
		require.Equal(t, tc.expir, expiry, "expiry at %d units", tc.units)
		require.LessOrEqual(t, hb, expiry/2, "%d units", tc.units)
	}
}
