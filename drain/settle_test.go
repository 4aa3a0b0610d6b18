package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jsbridge/jsbridge/event"
)

// TestDecide is the specification of how a cycle's outcome settles a stream:
// every rule of decide (and of Cycle's doc comment) is a row. No store, no
// clock: the backoffs are deterministic functions whose results say which
// one was asked and with which argument.
func TestDecide(t *testing.T) {
	t.Parallel()

	ev := func(id, version int64, name string) event.Event {
		return event.Event{ID: id, Stream: "order-1", Version: version, Name: name, Data: []byte(`{}`)}
	}
	placed, paid, shipped := ev(101, 5, "Placed"), ev(102, 6, "Paid"), ev(103, 7, "Shipped")
	unreadable := shipped
	unreadable.Data, unreadable.Err = nil, errors.New("data is NULL")
	three := []event.Event{placed, paid, shipped}
	two := []event.Event{placed, paid}

	policy := settlePolicy{
		maxRetries:    3,
		backoff:       func(retry int) time.Duration { return time.Duration(retry+1) * time.Second },
		outageBackoff: func(outages int) time.Duration { return time.Duration(outages+1) * time.Minute },
		outages:       2,
	}
	// claim is stream order-1 with its watermark at version 4, just before
	// the batch, after retry failed attempts.
	claim := func(retry int) event.Claim { return event.Claim{Stream: "order-1", Watermark: 4, Retry: retry} }

	busy := errors.New("nats: no responders available for request")
	tooLarge := errors.New("maximum payload exceeded")
	timeout := errors.New("context deadline exceeded")

	// want is what a decision says, with the failed event by its id (0: none).
	type want struct {
		act         action
		done        int
		version, id int64
		failedID    int64
		delay       time.Duration
		reason      string
	}
	tests := []struct {
		name         string
		claim        event.Claim
		events       []event.Event
		result       Result
		bad          *event.Event
		shuttingDown bool
		want         want
	}{
		{
			name: "whole batch done: ack to the last event", claim: claim(0), events: three,
			result: Result{Done: 3},
			want:   want{act: actAck, done: 3, version: 7, id: 103},
		},
		{
			name: "whole batch done after earlier failures: ack", claim: claim(3), events: three,
			result: Result{Done: 3},
			want:   want{act: actAck, done: 3, version: 7, id: 103},
		},
		{
			name: "failure after progress: retry from the failed event, first backoff", claim: claim(0), events: three,
			result: Result{Done: 1, Err: busy},
			want:   want{act: actRetry, done: 1, version: 5, id: 101, failedID: 102, delay: time.Second, reason: "event 102 (version 6, Paid): " + busy.Error()},
		},
		{
			name: "failure on the first event keeps the watermark; backoff by the retry count", claim: claim(1), events: three,
			result: Result{Done: 0, Err: busy},
			want:   want{act: actRetry, version: 4, failedID: 101, delay: 2 * time.Second, reason: "event 101 (version 5, Placed): " + busy.Error()},
		},
		{
			name: "the last retry MaxRetries allows", claim: claim(2), events: three,
			result: Result{Done: 0, Err: busy},
			want:   want{act: actRetry, version: 4, failedID: 101, delay: 3 * time.Second, reason: "event 101 (version 5, Placed): " + busy.Error()},
		},
		{
			name: "retries exhausted: block, saying after how many attempts", claim: claim(3), events: three,
			result: Result{Done: 2, Err: busy},
			want:   want{act: actBlock, done: 2, version: 6, id: 102, failedID: 103, reason: "event 103 (version 7, Shipped): " + busy.Error() + " (after 4 attempts)"},
		},
		{
			name: "non-retryable: block at once, keeping the progress before it", claim: claim(0), events: three,
			result: Result{Done: 1, Err: NonRetryable(tooLarge)},
			want:   want{act: actBlock, done: 1, version: 5, id: 101, failedID: 102, reason: "event 102 (version 6, Paid): non-retryable: " + tooLarge.Error()},
		},
		{
			name: "non-retryable wrapped by the handler: block", claim: claim(1), events: three,
			result: Result{Done: 0, Err: fmt.Errorf("publish: %w", NonRetryable(tooLarge))},
			want:   want{act: actBlock, version: 4, failedID: 101, reason: "event 101 (version 5, Placed): publish: non-retryable: " + tooLarge.Error()},
		},
		{
			name: "non-retryable while shutting down: still blocks", claim: claim(0), events: three,
			result: Result{Done: 1, Err: NonRetryable(tooLarge)}, shuttingDown: true,
			want: want{act: actBlock, done: 1, version: 5, id: 101, failedID: 102, reason: "event 102 (version 6, Paid): non-retryable: " + tooLarge.Error()},
		},
		{
			name: "unavailable: postpone on the outage schedule, keeping the progress", claim: claim(2), events: three,
			result: Result{Done: 1, Err: Unavailable(timeout)},
			want:   want{act: actPostpone, done: 1, version: 5, id: 101, failedID: 102, delay: 3 * time.Minute, reason: "event 102 (version 6, Paid): bus unavailable: " + timeout.Error()},
		},
		{
			name: "unavailable past MaxRetries: postpone, never block", claim: claim(7), events: three,
			result: Result{Done: 0, Err: Unavailable(timeout)},
			want:   want{act: actPostpone, version: 4, failedID: 101, delay: 3 * time.Minute, reason: "event 101 (version 5, Placed): bus unavailable: " + timeout.Error()},
		},
		{
			name: "unavailable wrapped by the handler: postpone", claim: claim(0), events: three,
			result: Result{Done: 0, Err: fmt.Errorf("publish: %w", Unavailable(timeout))},
			want:   want{act: actPostpone, version: 4, failedID: 101, delay: 3 * time.Minute, reason: "event 101 (version 5, Placed): publish: bus unavailable: " + timeout.Error()},
		},
		{
			name: "shutdown after progress: ack what was done", claim: claim(0), events: three,
			result: Result{Done: 2, Err: Unavailable(context.Canceled)}, shuttingDown: true,
			want: want{act: actAck, done: 2, version: 6, id: 102, failedID: 103},
		},
		{
			name: "shutdown before any progress: release, no retry counted", claim: claim(0), events: three,
			result: Result{Done: 0, Err: Unavailable(context.Canceled)}, shuttingDown: true,
			want: want{act: actRelease, version: 4, failedID: 101, reason: "bus unavailable: context canceled"},
		},
		{
			name: "shutdown past MaxRetries with nothing done: release, not block", claim: claim(9), events: three,
			result: Result{Done: 0, Err: busy}, shuttingDown: true,
			want: want{act: actRelease, version: 4, failedID: 101, reason: busy.Error()},
		},
		{
			name: "shutdown with the whole batch done: ack", claim: claim(0), events: three,
			result: Result{Done: 3}, shuttingDown: true,
			want: want{act: actAck, done: 3, version: 7, id: 103},
		},
		{
			name: "no error yet Done short of the batch: the handler's fault, retried", claim: claim(0), events: three,
			result: Result{Done: 2},
			want:   want{act: actRetry, done: 2, version: 6, id: 102, failedID: 103, delay: time.Second, reason: "event 103 (version 7, Shipped): handler reported no error but Done 2 of 3 events"},
		},
		{
			name: "Done beyond the batch: nothing counts as done", claim: claim(0), events: three,
			result: Result{Done: 4},
			want:   want{act: actRetry, version: 4, failedID: 101, delay: time.Second, reason: "event 101 (version 5, Placed): handler reported Done 4 of 3 events (error: <nil>)"},
		},
		{
			// The handler broke its contract: its error is kept as text
			// only, so the stream is retried (and blocks after MaxRetries)
			// rather than blocked by an error that may not be its own.
			name: "negative Done with a non-retryable error: retried, nothing done", claim: claim(0), events: three,
			result: Result{Done: -1, Err: NonRetryable(tooLarge)},
			want:   want{act: actRetry, version: 4, failedID: 101, delay: time.Second, reason: "event 101 (version 5, Placed): handler reported Done -1 of 3 events (error: non-retryable: " + tooLarge.Error() + ")"},
		},
		{
			name: "no events although pending: retry at the watermark", claim: claim(0),
			result: Result{Err: errors.New("no events after watermark 4 although the stream was pending")},
			want:   want{act: actRetry, version: 4, delay: time.Second, reason: "no events after watermark 4 although the stream was pending"},
		},
		{
			name: "no events although pending, retries exhausted: block", claim: claim(3),
			result: Result{Err: errors.New("no events after watermark 4 although the stream was pending")},
			want:   want{act: actBlock, version: 4, reason: "no events after watermark 4 although the stream was pending (after 4 attempts)"},
		},
		{
			name: "unreadable event after a batch handled whole: block at it", claim: claim(0), events: two, bad: &unreadable,
			result: Result{Done: 2},
			want:   want{act: actBlock, done: 2, version: 6, id: 102, failedID: 103, reason: "event 103 (version 7, Shipped): non-retryable: data is NULL"},
		},
		{
			name: "unreadable event after a batch that failed before it: the failure decides", claim: claim(0), events: two, bad: &unreadable,
			result: Result{Done: 1, Err: busy},
			want:   want{act: actRetry, done: 1, version: 5, id: 101, failedID: 102, delay: time.Second, reason: "event 102 (version 6, Paid): " + busy.Error()},
		},
		{
			name: "unreadable event after a batch cut by an outage: postpone", claim: claim(0), events: two, bad: &unreadable,
			result: Result{Done: 0, Err: Unavailable(timeout)},
			want:   want{act: actPostpone, version: 4, failedID: 101, delay: 3 * time.Minute, reason: "event 101 (version 5, Placed): bus unavailable: " + timeout.Error()},
		},
		{
			name: "unreadable event after a batch handled whole, at shutdown: block at it", claim: claim(0), events: two, bad: &unreadable,
			result: Result{Done: 2}, shuttingDown: true,
			want: want{act: actBlock, done: 2, version: 6, id: 102, failedID: 103, reason: "event 103 (version 7, Shipped): non-retryable: data is NULL"},
		},
		{
			// A stream whose first event past the watermark is unreadable
			// (Cycle's stuck streams): blocked at it, the watermark unmoved.
			name:  "first event unreadable: block at the watermark",
			claim: event.Claim{Stream: "order-1", Watermark: 6}, events: []event.Event{unreadable},
			result: Result{Err: NonRetryable(unreadable.Err)},
			want:   want{act: actBlock, version: 6, failedID: 103, reason: "event 103 (version 7, Shipped): non-retryable: data is NULL"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			events := slices.Clone(tt.events)
			d := decide(tt.claim, Batch{Stream: tt.claim.Stream, Retry: tt.claim.Retry, Events: events}, tt.result, tt.bad, tt.shuttingDown, policy)
			got := want{act: d.act, done: d.done, version: d.version, id: d.id, failedID: failedID(d.failed), delay: d.delay, reason: d.reason}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.events, events, "decide must not change the batch")
		})
	}
}
