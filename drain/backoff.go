package drain

import (
	"math/rand/v2"
	"time"
)

// Default backoff: the first retry waits about backoffBase, each further one
// twice as long, up to backoffCap; every delay is jittered by ±backoffJitter
// so streams that failed together do not retry together.
const (
	backoffBase   = time.Second
	backoffCap    = 5 * time.Minute
	backoffJitter = 0.2
)

// exponentialBackoff is the default Config.Backoff: for a stream that has
// failed retry times before (0 on the first failure) it returns
// backoffBase·2^retry capped at backoffCap, times a random factor in
// [1-backoffJitter, 1+backoffJitter). Negative retry counts as 0.
func exponentialBackoff(retry int) time.Duration {
	d := backoffCap
	if retry < 0 {
		retry = 0
	}
	if retry < 30 { // beyond that the shift overflows; the cap applies anyway
		d = min(backoffBase<<retry, backoffCap)
	}
	f := 1 - backoffJitter + 2*backoffJitter*rand.Float64()
	return time.Duration(float64(d) * f)
}

// Default outage backoff: a stream whose attempt failed because the bus was
// unavailable (UnavailableError) waits about outageBackoffBase, then twice as
// long for each further cycle in a row that meets the outage, up to
// outageBackoffCap, ±backoffJitter. That is at most 5 attempts per stream
// in the first minute of an outage and at most 3 a minute after (2 on
// average): an outage of any length costs each stream a few attempts a
// minute, and a stream resumes at most outageBackoffCap plus jitter (36 s)
// after the bus is back.
const (
	outageBackoffBase = 5 * time.Second
	outageBackoffCap  = 30 * time.Second
)

// outageBackoff is the default Config.OutageBackoff: after outages cycles
// in a row that met the outage (0 at its start) it returns
// outageBackoffBase·2^outages capped at outageBackoffCap, times a random
// factor in [1-backoffJitter, 1+backoffJitter). Negative counts as 0.
func outageBackoff(outages int) time.Duration {
	d := outageBackoffCap
	if outages < 0 {
		outages = 0
	}
	if outages < 30 {
		d = min(outageBackoffBase<<outages, outageBackoffCap)
	}
	f := 1 - backoffJitter + 2*backoffJitter*rand.Float64()
	return time.Duration(float64(d) * f)
}
