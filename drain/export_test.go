package drain

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// WithDeadlineForTest exposes withDeadline to the package's external tests.
func WithDeadlineForTest(clock clockwork.Clock, at time.Time) (context.Context, context.CancelFunc) {
	return withDeadline(context.Background(), clock, at)
}
