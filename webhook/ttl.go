package webhook

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidRetryProfile is wrapped by MinSafeTTL for a RetryProfile field
// with a bad value; the error names the field and the value.
var ErrInvalidRetryProfile = errors.New("invalid retry profile")

// DefaultSafetyFactor multiplies the sender's retry envelope in MinSafeTTL
// when RetryProfile.SafetyFactor is 0.
const DefaultSafetyFactor = 2.0

// RetryProfile is how a sender retries one event, as a receiver needs it to
// size its idempotency TTL. For a jsbridge subscription, copy its timeout,
// max_deliver and backoff (the consumer's defaults: 10 s, 10, and 1 s, 5 s,
// 30 s, 2 min, 5 min), and set HandOver to twice the consumer's --lease-ttl
// (10 s by default: 20 s).
type RetryProfile struct {
	// MaxDeliver is the number of attempts of one event, the first
	// included. Must be >= 1: a sender that retries forever (JetStream's -1)
	// has no finite safe TTL.
	MaxDeliver int
	// Timeout bounds one attempt (the sender's request timeout). Must be > 0.
	Timeout time.Duration
	// HandOver is how long after an attempt starts the sender may try
	// again when the process making it dies mid-attempt: for jsbridge, the
	// time for another replica to take over the event's partition, at most
	// twice the consumer's lease TTL (--lease-ttl, 10 s by default). Must
	// be >= 0.
	HandOver time.Duration
	// AckWait is the same bound under its earlier name, from when the
	// consumer's JetStream consumers redelivered after their AckWait; the
	// larger of AckWait and HandOver counts. Must be >= 0.
	//
	// Deprecated: use HandOver; the consumer acks nothing on the bus now.
	AckWait time.Duration
	// BackOff is the delay before each retry: after attempt n the sender
	// waits BackOff[n-1], the last entry repeating; empty means no delay.
	// Entries must be >= 0.
	BackOff []time.Duration
	// RetryAfter is the longest Retry-After the receiver answers with and
	// the sender honours instead of BackOff (with Handler: its lease, which
	// it sends on 503 "in-progress"; capped by the sender, 5 min for
	// jsbridge). 0 when the receiver sends none. Must be >= 0.
	RetryAfter time.Duration
	// SafetyFactor multiplies the envelope, for clock skew, InProgress
	// extensions and slow redeliveries. 0 means DefaultSafetyFactor (2);
	// otherwise it must be >= 1.
	SafetyFactor float64
	// Replay is added after the factor: how long after an event is
	// dead-lettered an operator's replay (same Idempotency-Key) should still
	// be recognised as a duplicate. 0 for none. Must be >= 0.
	Replay time.Duration
}

// MinSafeTTL returns the shortest idempotency TTL (the ttl of Handler and
// IdempotencyStore.Complete) that still recognises every redelivery of an
// event the sender described by p can make, rounded up to a whole second:
//
//	gap(n)   = max(Timeout, HandOver) + max(BackOff[n-1], RetryAfter)   for n = 1 … MaxDeliver-1
//	envelope = gap(1) + … + gap(MaxDeliver-1) + Timeout
//	TTL      = ceil(envelope × SafetyFactor) + Replay
//
// Each gap is the longest time from the start of attempt n to the start of
// attempt n+1: the attempt runs to its timeout, or the process making it
// dies and another takes over within HandOver, then the sender waits its
// backoff or the receiver's Retry-After. The last attempt lasts at most
// Timeout. A record kept that long after the first attempt outlives every
// duplicate, since the TTL starts when an attempt completes, later than the
// first attempt began. (HandOver stands for max(HandOver, AckWait).)
//
// With jsbridge's defaults (10 attempts, 10 s timeout, a 20 s hand-over,
// backoff 1 s, 5 s, 30 s, 2 min, 5 min, no Retry-After, factor 2) the
// envelope is 30m46s and the TTL 1h1m32s. Errors wrap
// ErrInvalidRetryProfile.
func MinSafeTTL(p RetryProfile) (time.Duration, error) {
	bad := func(field string, value any, want string) (time.Duration, error) {
		return 0, fmt.Errorf("%w: %s %v (%s)", ErrInvalidRetryProfile, field, value, want)
	}
	switch {
	case p.MaxDeliver < 1:
		return bad("MaxDeliver", p.MaxDeliver, "want >= 1; a sender retrying without limit has no safe TTL: "+
			"give the subscription a finite max_deliver (jsbridge's default is 10) and compute the TTL from it, "+
			"or keep records at least SafetyFactor × (the consumer's --disable-after, 24h by default, + one longest retry gap, "+
			"max(Timeout, HandOver) + max(last BackOff, RetryAfter)) + Replay, 48h10m40s with jsbridge's defaults "+
			"(docs/receiver.md)")
	case p.Timeout <= 0:
		return bad("Timeout", p.Timeout, "want > 0")
	case p.HandOver < 0:
		return bad("HandOver", p.HandOver, "want >= 0")
	case p.AckWait < 0:
		return bad("AckWait", p.AckWait, "want >= 0")
	case p.RetryAfter < 0:
		return bad("RetryAfter", p.RetryAfter, "want >= 0")
	case p.Replay < 0:
		return bad("Replay", p.Replay, "want >= 0")
	case p.SafetyFactor != 0 && !(p.SafetyFactor >= 1) || math.IsInf(p.SafetyFactor, 0):
		return bad("SafetyFactor", p.SafetyFactor, "want 0 for the default 2, or a finite number >= 1")
	}
	for i, b := range p.BackOff {
		if b < 0 {
			return bad(fmt.Sprintf("BackOff[%d]", i), b, "want >= 0")
		}
	}
	factor := p.SafetyFactor
	if factor == 0 {
		factor = DefaultSafetyFactor
	}
	// In float64 seconds, so that no profile overflows on the way; the gaps
	// after the last BackOff entry are all alike.
	retries := p.MaxDeliver - 1
	gap := func(backoff time.Duration) float64 {
		return max(p.Timeout, p.HandOver, p.AckWait).Seconds() + max(backoff, p.RetryAfter).Seconds()
	}
	envelope := p.Timeout.Seconds()
	last := time.Duration(0)
	for n := 1; n <= retries && n <= len(p.BackOff); n++ {
		last = p.BackOff[n-1]
		envelope += gap(last)
	}
	if rest := retries - len(p.BackOff); rest > 0 {
		envelope += float64(rest) * gap(last)
	}
	ttl := math.Ceil(envelope*factor)*float64(time.Second) + float64(p.Replay)
	if ttl >= math.MaxInt64 {
		return bad("profile", fmt.Sprintf("envelope %.0fs × %g", envelope, factor), "TTL overflows time.Duration")
	}
	return time.Duration(math.Ceil(envelope*factor))*time.Second + p.Replay, nil
}
