package consumer

import (
	"regexp"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver"
)

// ErrInvalidWindow is wrapped by Consumer.ReplayWindow when the window is
// misconfigured (no Since, Until not after Since, both Stream and Match);
// the message names the field and the value.
var ErrInvalidWindow = deliver.ErrInvalidWindow

// Window says what Consumer.ReplayWindow re-delivers: the events the
// events stream holds from Since to Until that the subscription selects,
// narrowed to one source stream (Stream) or to the source streams whose
// name matches Match.
type Window struct {
	// Since is the window's start: messages JetStream stored at or after
	// it (when the bridge published the event, not the event's created
	// time). Required.
	Since time.Time
	// Until is the window's end, exclusive. Zero: up to the events
	// stream's last message when the replay begins. A replay never goes
	// past that message: later events are the subscription's own.
	Until time.Time
	// Stream, when not "", narrows the window to one source stream (the
	// event-store stream, e.g. "order-42").
	Stream string
	// Match, when not nil, narrows the window to the source streams whose
	// name it matches. At most one of Stream and Match.
	Match *regexp.Regexp
	// DryRun counts what would be sent, sending nothing.
	DryRun bool
	// Progress, when not nil, is called after each event sent (counted,
	// in a dry run) with the result so far, on ReplayWindow's goroutine.
	Progress func(WindowResult)
}

// WindowPosition is one event of the events stream, as replay reports it
// (these JSON keys).
type WindowPosition struct {
	// EventID is the event id (Nats-Msg-Id, the Idempotency-Key).
	EventID string `json:"event_id"`
	// Seq is its sequence in the events stream.
	Seq uint64 `json:"seq"`
	// Time is when JetStream stored it: give it as Since to resume there.
	Time time.Time `json:"time"`
	// Stream is its source stream.
	Stream string `json:"stream"`
}

// WindowFailure is the event a replay stopped at: its POST was not
// answered 2xx (or could not be built).
type WindowFailure struct {
	WindowPosition
	// Status is the HTTP status, 0 without a response.
	Status int `json:"status"`
	// Reason says why, e.g. "HTTP 503 Service Unavailable".
	Reason string `json:"reason"`
}

// WindowResult is how far a replay got (these JSON keys).
type WindowResult struct {
	// Subscription is the subscription replayed to.
	Subscription string `json:"subscription"`
	// Matched counts the window's events read so far that the
	// subscription selects and Stream or Match let through: all of them
	// once a replay (or a dry run) finished.
	Matched int `json:"matched"`
	// Delivered counts those the endpoint answered 2xx (0 in a dry run).
	Delivered int `json:"delivered"`
	// Last is the last event delivered (counted, in a dry run); zero
	// before the first.
	Last WindowPosition `json:"last"`
	// Failed is the event the replay stopped at; nil when none failed.
	// Nothing after it was sent.
	Failed *WindowFailure `json:"failed,omitempty"`
}

// engine is w in the engine's types.
func (w Window) engine() deliver.Window {
	dw := deliver.Window{Since: w.Since, Until: w.Until, Stream: w.Stream, Match: w.Match, DryRun: w.DryRun}
	if w.Progress != nil {
		dw.Progress = func(r deliver.WindowResult) { w.Progress(fromEngine(r)) }
	}
	return dw
}

// fromEngine is the engine's result in the front door's types.
func fromEngine(r deliver.WindowResult) WindowResult {
	out := WindowResult{Subscription: r.Subscription, Matched: r.Matched, Delivered: r.Delivered, Last: WindowPosition(r.Last)}
	if r.Failed != nil {
		out.Failed = &WindowFailure{WindowPosition: WindowPosition(r.Failed.WindowPosition), Status: r.Failed.Status, Reason: r.Failed.Reason}
	}
	return out
}
