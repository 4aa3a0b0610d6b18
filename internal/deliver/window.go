package deliver

import (
	"errors"
	"regexp"
	"time"
)

// Replay by time: what the events stream holds in a window of time is
// POSTed once more to one subscription's endpoint, as a normal delivery
// would send it (body, signature with the current secrets, Idempotency-Key
// = event id), one event at a time in the stream's order, outside the
// circuit breaker, touching no position (WindowRun; the caller reads the
// events). A POST that is not answered 2xx stops the replay at once with
// the position reached (WindowResult.Failed): nothing after it is sent,
// and the same replay started again with Since = Failed.Time resumes at
// that event.
//
// An ordered subscription's replay names each event's predecessor in the
// version chain (Jsbridge-Previous-Version; no partition, no epoch: it is
// no partition's owner): for a stream's first event in the window, the
// one WindowRun.Before finds before the window; for the next ones, the
// one before it in the window, which this replay delivered.

// ErrInvalidWindow is wrapped by Window.Validate when the window is
// misconfigured; the message names the field and the value.
var ErrInvalidWindow = errors.New("invalid replay window")

// Window says what a replay by time re-delivers.
type Window struct {
	// Since is the window's start: messages JetStream stored at or after
	// it (the time the bridge published the event, not the event's own
	// created time). Required.
	Since time.Time
	// Until is the window's end, exclusive. Zero: up to the events
	// stream's last message when the replay begins (events published
	// later are left to the subscription's own delivery).
	Until time.Time
	// Stream, when not "", narrows the window to one source stream (the
	// event-store stream, e.g. "order-42").
	Stream string
	// Match, when not nil, narrows the window to the source streams whose
	// name it matches. At most one of Stream and Match.
	Match *regexp.Regexp
	// DryRun counts what would be sent, sending nothing.
	DryRun bool
	// Progress, when not nil, is called after each event in the window
	// was sent (or counted, in a dry run), on WindowRun.Send's goroutine.
	Progress func(WindowResult)
}

// WindowPosition is one event of the events stream.
type WindowPosition struct {
	// EventID is the event id (Nats-Msg-Id).
	EventID string `json:"event_id"`
	// Seq is its sequence in the events stream.
	Seq uint64 `json:"seq"`
	// Time is when JetStream stored it.
	Time time.Time `json:"time"`
	// Stream is its source stream.
	Stream string `json:"stream"`
}

// WindowFailure is the event a replay stopped at.
type WindowFailure struct {
	WindowPosition
	// Status is the HTTP status, 0 without a response.
	Status int `json:"status"`
	// Reason says why it failed, e.g. "HTTP 503 Service Unavailable".
	Reason string `json:"reason"`
}

// WindowResult is how far a replay by time got.
type WindowResult struct {
	// Subscription is the subscription replayed to.
	Subscription string `json:"subscription"`
	// Matched counts the events of the window read so far that pass
	// Stream or Match (all of them in a finished dry run).
	Matched int `json:"matched"`
	// Delivered counts those the endpoint answered 2xx (0 in a dry run).
	Delivered int `json:"delivered"`
	// Last is the last event delivered (counted, in a dry run); zero
	// before the first.
	Last WindowPosition `json:"last"`
	// Failed is the event the replay stopped at: its POST was not
	// answered 2xx, or could not be built. Nil when none failed.
	Failed *WindowFailure `json:"failed,omitempty"`
}
