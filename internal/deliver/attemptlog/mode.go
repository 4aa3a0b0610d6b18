package attemptlog

import (
	"errors"
	"fmt"
)

// Mode says which attempts the attempts record keeps.
//
// Under ModeFailures (the default, and the zero value) a success on the
// first attempt leaves no record: on the success path every event would
// otherwise be stored a second time, about as big as on the events stream
// itself. It is counted in jsbridge_consumer_deliveries_total{outcome="ack"}
// all the same, and `consumer trace` reads from the subscriptions'
// positions whether an event without records was settled.
type Mode string

const (
	// ModeFailures keeps every attempt that did not succeed (retry, term,
	// exhausted, breaker_open, throttled, ...), and the success that ends
	// a series with an earlier failure (attempt > 1, or after an attempt
	// retried in place that spent no attempt number), so that the trace of
	// an event that had trouble shows how it ended. A success on the first
	// attempt is not recorded.
	ModeFailures Mode = "failures"
	// ModeAll keeps every attempt, successes on the first attempt too:
	// one record per webhook.
	ModeAll Mode = "all"
)

// ErrInvalidMode is wrapped by ParseMode's error.
var ErrInvalidMode = errors.New("attempts record: invalid mode")

// ParseMode returns the Mode named s: "failures" or "all"; "" is
// ModeFailures. Anything else is an error wrapping ErrInvalidMode that
// names the value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeFailures:
		return ModeFailures, nil
	case ModeAll:
		return ModeAll, nil
	}
	return "", fmt.Errorf("%w %q (want %q or %q)", ErrInvalidMode, s, ModeFailures, ModeAll)
}
