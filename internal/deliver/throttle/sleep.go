package throttle

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// sleep waits d on clock, or until ctx ends, whichever comes first.
func sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) {
	if d <= 0 {
		return
	}
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.Chan():
	}
}
