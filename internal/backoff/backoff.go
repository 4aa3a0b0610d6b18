// Package backoff spaces the attempts at something that is expected to come
// back (a server starting, a leader being elected, a stream being created
// by another process): pauses growing exponentially up to a cap, each with
// random jitter, so replicas that lost a dependency together do not retry
// in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Defaults of Backoff.
const (
	// DefaultMin is the first pause.
	DefaultMin = 500 * time.Millisecond
	// DefaultMax caps the pause.
	DefaultMax = 15 * time.Second
	// DefaultJitter is the spread of each pause: ±20 %.
	DefaultJitter = 0.2
)

// Backoff yields growing pauses: Min, 2×Min, 4×Min, ... up to Max, each
// multiplied by a random factor in [1-Jitter, 1+Jitter]. The zero value
// uses the defaults: 0.5 s doubling to 15 s, ±20 %. It is not safe for
// concurrent use.
type Backoff struct {
	// Min is the first pause (before jitter). Default DefaultMin.
	Min time.Duration
	// Max caps the pause (before jitter). Default DefaultMax.
	Max time.Duration
	// Jitter is the relative spread, in [0, 1). Default DefaultJitter; a
	// negative value means none.
	Jitter float64

	n int // doublings so far
}

// Next returns the pause before the next attempt and moves the backoff on.
func (b *Backoff) Next() time.Duration {
	lo, hi, j := b.Min, b.Max, b.Jitter
	if lo <= 0 {
		lo = DefaultMin
	}
	if hi <= 0 {
		hi = DefaultMax
	}
	hi = max(hi, lo)
	switch {
	case j == 0:
		j = DefaultJitter
	case j < 0:
		j = 0
	}
	d := hi
	if b.n < 62 {
		if g := lo << b.n; g > 0 && g < hi {
			d = g
			b.n++
		}
	}
	return time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
}

// Reset starts the pauses over at Min: call it after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits d, or until ctx ends; it reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
