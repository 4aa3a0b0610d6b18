package bridge_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/drain"
)

func TestFitPublishTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		publish, lease time.Duration
		want           time.Duration
		lowered        bool
	}{
		{5 * time.Second, 30 * time.Second, 5 * time.Second, false}, // the defaults
		{0, 0, 5 * time.Second, false},                              // zero values are the defaults
		{5 * time.Second, 5 * time.Second, 2 * time.Second, true},   // the cycle's deadline (4 s) would cut a 5 s publish
		{0, 10 * time.Second, 4 * time.Second, true},
		{5 * time.Second, 4 * time.Second, 1600 * time.Millisecond, true},
		{12 * time.Second, 30 * time.Second, 12 * time.Second, false}, // exactly the most
		{13 * time.Second, 30 * time.Second, 12 * time.Second, true},
		{time.Second, 3 * time.Second, time.Second, false},
		{-time.Second, 30 * time.Second, -time.Second, false}, // left for Validate to reject
	} {
		got, lowered := bridge.FitPublishTimeout(c.publish, c.lease)
		require.Equal(t, c.want, got, "publish %s, lease %s", c.publish, c.lease)
		require.Equal(t, c.lowered, lowered, "publish %s, lease %s", c.publish, c.lease)
		if c.publish >= 0 {
			// A reconciliation lookup and a publish, each at its full
			// timeout, fit before the handler's deadline.
			require.LessOrEqual(t, 2*got, drain.HandlerTimeout(c.lease), "publish %s, lease %s", c.publish, c.lease)
		}
	}
	require.Equal(t, 12*time.Second, bridge.MaxPublishTimeout(30*time.Second))
	require.Equal(t, 24*time.Second, drain.HandlerTimeout(30*time.Second))
	require.Equal(t, drain.HandlerTimeout(drain.DefaultLease), drain.HandlerTimeout(0))
}

func TestRequiredDuplicateWindow(t *testing.T) {
	t.Parallel()
	require.Equal(t, 90*time.Second, bridge.RequiredDuplicateWindow(30*time.Second, time.Minute))
	require.Equal(t, time.Minute, bridge.RequiredDuplicateWindow(-time.Second, time.Minute))
}
