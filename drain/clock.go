// Deadlines on the drain's clock.

package drain

import (
	"context"
	"errors"
	"time"

	"github.com/jonboulle/clockwork"
)

// withDeadline is context.WithDeadline on clock: the context reports at
// as its Deadline, ends when clock reaches it (Err then
// context.DeadlineExceeded, as the handler's classifiers expect), and its
// timer is stopped by cancel, so that a fake clock's waiters are only the
// waits still pending.
func withDeadline(parent context.Context, clock clockwork.Clock, at time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := clock.AfterFunc(clock.Until(at), func() { cancel(context.DeadlineExceeded) })
	return deadlineContext{Context: ctx, at: at}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// deadlineContext is a context that ends at a deadline of a clock.
type deadlineContext struct {
	context.Context
	at time.Time
}

// Deadline returns the deadline on the drain's clock.
func (c deadlineContext) Deadline() (time.Time, bool) { return c.at, true }

// Err is context.DeadlineExceeded once the deadline passed, else the
// parent's or Canceled.
func (c deadlineContext) Err() error {
	err := c.Context.Err()
	if err != nil && errors.Is(context.Cause(c.Context), context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}
