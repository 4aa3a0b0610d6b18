package drain

import (
	"context"
	"errors"
	"fmt"

	"github.com/jsbridge/jsbridge/event"
)

// Batch is the run of events of one claimed stream handed to a Handler, in
// version order, all after the stream's watermark.
type Batch struct {
	// Stream is the stream's name.
	Stream string
	// Retry counts the failed attempts on this stream since its last ack;
	// attempts that failed because the bus was unavailable do not count.
	Retry int
	// Reconcile is true when an earlier attempt may have published events
	// past the watermark without settling them: the claim took over an
	// expired lease (Claim.PreviousHolder is set: that holder died or hung
	// after publishing, before acking), the last attempt was postponed
	// because the bus did not answer (PreviousHolder is set too: its
	// publishes may have been stored after all), or an earlier attempt
	// failed (Retry > 0: a publish whose outcome is unknown may have been
	// stored). The handler must then find out what the bus already
	// holds for the stream and count those events as done instead of
	// sending them again; the duplicate window alone covers a re-publish only
	// within its span.
	Reconcile bool
	// Watermark is the stream's watermark when it was claimed: the version
	// of the last event forwarded (acked), -1 for none. A handler that finds
	// the bus holding less of the stream than that knows the bus lost
	// messages. The zero value (0) never says more than version 0 was
	// forwarded.
	Watermark int64
	// Events are the events after the watermark, in version order (never empty).
	Events []event.Event
}

// Result is a Handler's verdict on one Batch.
type Result struct {
	// Done is how many leading events of the batch were handled; the
	// watermark advances to Events[Done-1]. 0 <= Done <= len(Events).
	Done int
	// Err is nil when the whole batch was handled. Otherwise it says why
	// Events[Done] was not: a NonRetryableError blocks the stream at once,
	// an UnavailableError is retried on the Config.OutageBackoff schedule and never
	// blocks, any other error is retried with Backoff (and blocks after
	// MaxRetries).
	Err error
}

// Handler handles the batches of one drain cycle. It must return exactly one
// Result per batch, in the same order. Batches of different streams may be
// handled concurrently, but within one batch events must be handled in order
// and none after a failed one may count as done.
type Handler interface {
	Handle(ctx context.Context, batches []Batch) []Result
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, batches []Batch) []Result

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, batches []Batch) []Result { return f(ctx, batches) }

// NonRetryableError marks a failure that retrying cannot fix (a poison event:
// too large for the bus, not valid JSON). The drain blocks the stream at once.
type NonRetryableError struct {
	// Err is the underlying cause.
	Err error
}

// Error returns "non-retryable: " and the cause.
func (e *NonRetryableError) Error() string { return fmt.Sprintf("non-retryable: %v", e.Err) }

// Unwrap returns the cause.
func (e *NonRetryableError) Unwrap() error { return e.Err }

// NonRetryable wraps err as a NonRetryableError (nil stays nil).
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &NonRetryableError{Err: err}
}

// UnavailableError marks a failure of the bus, not of the stream: the
// server is unreachable, a publish or a lookup timed out or was cut short
// by the cycle's deadline, the JetStream stream does not answer. The drain
// retries such a stream on the Config.OutageBackoff schedule without counting a
// retry (Store.Postpone) and never blocks it for it, however often it
// fails; and when a cycle forwards
// nothing because of it, the drain pauses and probes with one stream at a
// time until the bus answers again (see Run).
type UnavailableError struct {
	// Err is the underlying cause.
	Err error
}

// Error returns "bus unavailable: " and the cause.
func (e *UnavailableError) Error() string { return fmt.Sprintf("bus unavailable: %v", e.Err) }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable wraps err as an UnavailableError (nil stays nil).
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &UnavailableError{Err: err}
}

// IsUnavailable reports whether err is or wraps an UnavailableError.
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}

// IsNonRetryable reports whether err is or wraps a NonRetryableError.
func IsNonRetryable(err error) bool {
	var nr *NonRetryableError
	return errors.As(err, &nr)
}
