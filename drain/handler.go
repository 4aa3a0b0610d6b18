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
	// Retry counts the failed attempts on this stream since its last ack.
	Retry int
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
	// any other error is retried with backoff (and blocks after MaxRetries).
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

// IsNonRetryable reports whether err is or wraps a NonRetryableError.
func IsNonRetryable(err error) bool {
	var nr *NonRetryableError
	return errors.As(err, &nr)
}
