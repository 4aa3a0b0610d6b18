package drain

import (
	"math/rand/v2"
	"time"
)

// Default backoff: the first retry waits about BackoffBase, each further one
// twice as long, up to BackoffCap; every delay is jittered by ±BackoffJitter
// so streams that failed together do not retry together.
const (
	BackoffBase   = time.Second
	BackoffCap    = 5 * time.Minute
	BackoffJitter = 0.2
)

// ExponentialBackoff is the default Config.Backoff: for a stream that has
// failed retry times before (0 on the first failure) it returns
// BackoffBase·2^retry capped at BackoffCap, times a random factor in
// [1-BackoffJitter, 1+BackoffJitter). Negative retry counts as 0.
func ExponentialBackoff(retry int) time.Duration {
	d := BackoffCap
	if retry < 0 {
		retry = 0
	}
	if retry < 30 { // beyond that the shift overflows; the cap applies anyway
		d = min(BackoffBase<<retry, BackoffCap)
	}
	f := 1 - BackoffJitter + 2*BackoffJitter*rand.Float64()
	return time.Duration(float64(d) * f)
}

// Default outage backoff: a stream whose attempt failed because the bus was
// unavailable (UnavailableError) waits about OutageBackoffBase, then twice as
// long for each further cycle in a row that meets the outage, up to
// OutageBackoffCap, ±BackoffJitter. That is at most 5 attempts per stream
// in the first minute of an outage and at most 3 a minute after (2 on
// average): an outage of any length costs each stream a few attempts a
// minute, and a stream resumes at most OutageBackoffCap plus jitter (36 s)
// after the bus is back.
const (
	OutageBackoffBase = 5 * time.Second
	OutageBackoffCap  = 30 * time.Second
)

// OutageBackoff is the default Config.OutageBackoff: after outages cycles
// in a row that met the outage (0 at its start) it returns
// OutageBackoffBase·2^outages capped at OutageBackoffCap, times a random
// factor in [1-BackoffJitter, 1+BackoffJitter). Negative counts as 0.
func OutageBackoff(outages int) time.Duration {
	d := OutageBackoffCap
	if outages < 0 {
		outages = 0
	}
	if outages < 30 {
		d = min(OutageBackoffBase<<outages, OutageBackoffCap)
	}
	f := 1 - BackoffJitter + 2*BackoffJitter*rand.Float64()
	return time.Duration(float64(d) * f)
}
