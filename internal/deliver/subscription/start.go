package subscription

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Where a subscription starts (docs/subscriptions-start.md): a start is
// resolved once per subscription into an events stream sequence, where
// its position begins on every partition; a partition claimed later goes
// on from the subscription's position, the start is not applied again.

// StartPolicy is the kind of a Start.
type StartPolicy string

const (
	// StartNew delivers only the events stored after the subscription
	// was provisioned (the events stream's last sequence then), as
	// webhook platforms do for a new endpoint. The default.
	StartNew StartPolicy = "new"
	// StartAll delivers every event the events stream still holds.
	StartAll StartPolicy = "all"
	// StartTime delivers the events stored in the events stream at or
	// after Start.Time (the time JetStream stored them, not the events'
	// own creation time in Postgres).
	StartTime StartPolicy = "time"
	// StartSequence delivers the events from the events stream's sequence
	// Start.Sequence on (the sequence `nats stream view EVENTS` and
	// `consumer trace` show).
	StartSequence StartPolicy = "sequence"
)

// ErrInvalidStart is wrapped by ParseStart for a start it cannot read.
var ErrInvalidStart = errors.New("invalid start")

// Start says where a subscription's position begins on every partition
// when the subscription is first provisioned. The zero value is StartNew.
type Start struct {
	// Policy is StartNew (default ""), StartAll, StartTime or
	// StartSequence.
	Policy StartPolicy
	// Time is where StartTime begins; not zero for it, unused otherwise.
	Time time.Time
	// Sequence is the events stream's sequence StartSequence begins at; 1
	// or more for it, unused otherwise.
	Sequence uint64
}

// StartAtTime returns the start at the first event stored at or after t.
func StartAtTime(t time.Time) Start { return Start{Policy: StartTime, Time: t} }

// StartAtSequence returns the start at the events stream's sequence seq.
func StartAtSequence(seq uint64) Start { return Start{Policy: StartSequence, Sequence: seq} }

// ParseStart reads a start written as Start.String writes it: "new",
// "all", "time:<RFC 3339>" or "sequence:<n>" (a space after the colon is
// allowed; "" is "new"). An error wraps ErrInvalidStart and quotes s.
func ParseStart(s string) (Start, error) {
	v := strings.TrimSpace(s)
	kind, arg, hasArg := strings.Cut(v, ":")
	kind, arg = strings.TrimSpace(kind), strings.TrimSpace(arg)
	switch {
	case v == "" || v == string(StartNew):
		return Start{Policy: StartNew}, nil
	case v == string(StartAll):
		return Start{Policy: StartAll}, nil
	case hasArg && kind == string(StartTime):
		t, err := time.Parse(time.RFC3339Nano, arg)
		if err != nil {
			return Start{}, fmt.Errorf("%w %q: %q is not an RFC 3339 time (e.g. 2026-11-01T00:00:00Z)", ErrInvalidStart, s, arg)
		}
		return StartAtTime(t), nil
	case hasArg && kind == string(StartSequence):
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || n == 0 {
			return Start{}, fmt.Errorf("%w %q: %q is not a stream sequence (1 or more)", ErrInvalidStart, s, arg)
		}
		return StartAtSequence(n), nil
	}
	return Start{}, fmt.Errorf("%w %q: want new, all, time:<RFC 3339> or sequence:<n>", ErrInvalidStart, s)
}

// String writes s as ParseStart reads it: "new", "all",
// "time:2026-11-01T00:00:00Z" (UTC) or "sequence:42".
func (s Start) String() string {
	switch s.Policy {
	case "", StartNew:
		return string(StartNew)
	case StartTime:
		return string(StartTime) + ":" + s.Time.UTC().Format(time.RFC3339Nano)
	case StartSequence:
		return string(StartSequence) + ":" + strconv.FormatUint(s.Sequence, 10)
	}
	return string(s.Policy)
}

// validate reports what is wrong with s, or nil.
func (s Start) validate() error {
	switch s.Policy {
	case "", StartNew, StartAll:
		return nil
	case StartTime:
		if s.Time.IsZero() {
			return errors.New("time start without a time")
		}
		return nil
	case StartSequence:
		if s.Sequence == 0 {
			return errors.New("sequence start at 0 (want 1 or more)")
		}
		return nil
	}
	return fmt.Errorf("%q (want %q, %q, %q or %q)", s.Policy, StartNew, StartAll, StartTime, StartSequence)
}
