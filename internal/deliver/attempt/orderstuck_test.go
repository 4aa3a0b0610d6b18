package attempt_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/wire"
)

func TestOrderStuckAfterTheBound(t *testing.T) {
	t.Parallel()
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	resp := attempt.Response{Status: http.StatusConflict, Order: wire.OrderGap, At: since}
	for _, tc := range []struct {
		name       string
		after      time.Duration
		stuckAfter time.Duration
		want       bool
	}{
		{"refused for less than the bound", 4*time.Minute + 59*time.Second, 5 * time.Minute, false},
		{"refused for the bound", 5 * time.Minute, 5 * time.Minute, true},
		{"refused for longer", time.Hour, 5 * time.Minute, true},
		{"no bound", time.Hour, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dl, stuck := attempt.OrderStuck(since, since.Add(tc.after), tc.stuckAfter, resp, "42", 3)
			require.Equal(t, tc.want, stuck)
			if !stuck {
				return
			}
			require.True(t, dl.OrderStuck)
			require.Equal(t, "42", dl.EventID)
			require.Equal(t, 3, dl.Attempt)
			require.Equal(t, http.StatusConflict, dl.Status)
			require.Contains(t, dl.Reason, "(gap)")
		})
	}
}
