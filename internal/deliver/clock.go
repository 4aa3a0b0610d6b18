package deliver

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// The engine's time (lease renewals and deadlines, fence and successor
// waits, parking timers, retry backoff) comes from the Config.Clock it
// was given, so tests drive it with a fake clock instead of waiting. Time
// that measures I/O (a POST's latency, the signature's timestamp, the
// attempts record's write deadlines) stays on the wall clock.

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
