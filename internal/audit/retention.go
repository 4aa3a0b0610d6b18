// Retention: telling an event the JetStream stream's own limits removed
// (aged out) from one JetStream lost.

package audit

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ClockTolerance is how far the clocks of Postgres and the NATS server
// may disagree when an event's creation time is compared with the
// stream's MaxAge: an event created less than MaxAge minus this before
// the server's time cannot have aged out.
const ClockTolerance = time.Minute

// Retention is what an audit knows of the JetStream stream's limits, to
// tell aged out from missing. The zero value has no limits: nothing ages
// out.
type Retention struct {
	// MaxAge, MaxBytes, MaxMsgs and MaxMsgsPerSubject are the stream's
	// limits (0: none).
	MaxAge            time.Duration
	MaxBytes          int64
	MaxMsgs           int64
	MaxMsgsPerSubject int64
	// Removed is set when the stream's first sequence is past 1: messages
	// have left it from the front (limits, or a purge).
	Removed bool
	// Now is the server's time when the stream was read.
	Now time.Time
}

// RetentionOf returns the Retention of a stream's info.
func RetentionOf(info *jetstream.StreamInfo) Retention {
	c := info.Config
	now := info.TimeStamp
	if now.IsZero() {
		now = time.Now()
	}
	return Retention{MaxAge: max(c.MaxAge, 0), MaxBytes: max(c.MaxBytes, 0), MaxMsgs: max(c.MaxMsgs, 0),
		MaxMsgsPerSubject: max(c.MaxMsgsPerSubject, 0), Removed: info.State.FirstSeq > 1, Now: now}
}

// agedOut reports whether a missing event of a stream was removed by the
// limits r describes rather than lost:
//
//   - MaxMsgsPerSubject n: JetStream holds at least n later versions of
//     the stream on the event's subject (the limit keeps the last n);
//   - MaxBytes or MaxMsgs: messages left from the front (Removed) and the
//     event comes before every version held of its stream (first: the
//     lowest held, -1 when none), as removal from the front leaves it;
//   - MaxAge: the same, and the event was created at least MaxAge (less
//     ClockTolerance) before the server's time.
//
// A server that lost its last writes loses a stream's tail, which these
// never explain unless none of the stream's messages is left at all.
func (r Retention) agedOut(version int64, created time.Time, laterOnSubject int64, first int64) bool {
	if r.MaxMsgsPerSubject > 0 && laterOnSubject >= r.MaxMsgsPerSubject {
		return true
	}
	head := r.Removed && (first < 0 || version < first)
	if !head {
		return false
	}
	if r.MaxBytes > 0 || r.MaxMsgs > 0 {
		return true
	}
	return r.MaxAge > 0 && !created.After(r.Now.Add(-r.MaxAge+ClockTolerance))
}
