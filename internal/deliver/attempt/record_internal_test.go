package attempt

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
)

// Under the default mode (failures) every attempt is recorded but a
// success on the first attempt with no failure before it; under all,
// every attempt is.
func TestKeepsRecordsFailuresAndTheSuccessEndingThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		outcome      string
		attempt      int
		afterFailure bool
		failures     bool // kept under ModeFailures
	}{
		{"a 2xx on the first attempt", OutcomeAck, 1, false, false},
		{"a 2xx after failed attempts", OutcomeAck, 3, false, true},
		{"a 2xx after a failure retried in place (throttled, order gate, breaker)", OutcomeAck, 1, true, true},
		{"a retry", OutcomeRetry, 1, false, true},
		{"a permanent failure", OutcomeTerm, 1, false, true},
		{"the last attempt", OutcomeExhausted, 10, false, true},
		{"breaker open", OutcomeBreakerOpen, 1, false, true},
		{"throttled", OutcomeThrottled, 1, false, true},
		{"disabled (410)", OutcomeDisabled, 1, false, true},
		{"a stale epoch", OutcomeStaleEpoch, 1, false, true},
		{"order stuck", OutcomeOrderStuck, 1, false, true},
		{"undecided (a panic)", "unknown", 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.failures, keeps(attemptlog.ModeFailures, tc.outcome, tc.attempt, tc.afterFailure), "failures")
			require.True(t, keeps(attemptlog.ModeAll, tc.outcome, tc.attempt, tc.afterFailure), "all")
		})
	}
}
