package drain

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// The package's unexported helpers and constants, for its external tests.
var (
	ExponentialBackoff = exponentialBackoff
	OutageBackoff      = outageBackoff
)

const (
	BackoffJitter     = backoffJitter
	OutageBackoffBase = outageBackoffBase
	OutageBackoffCap  = outageBackoffCap
	MaxOutagePause    = maxOutagePause
)

// WithDeadlineForTest exposes withDeadline to the package's external tests.
func WithDeadlineForTest(clock clockwork.Clock, at time.Time) (context.Context, context.CancelFunc) {
	return withDeadline(context.Background(), clock, at)
}
