// Package throttle is a subscription's AIMD rate limiter: the rate its
// POSTs are held to, cut by an endpoint's throttling answers (429, or 503
// with Retry-After) and grown back, and the pause a Retry-After asks for.
// The attempts (internal/deliver/attempt) wait on it before each POST and
// feed it every answer.
package throttle

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/jsbridge/jsbridge/internal/promreg"
)

// Throttling: each subscription's POSTs go through a rate limiter
// (golang.org/x/time/rate) whose rate is the subscription's RateLimit, or
// none. An endpoint that answers 429, or 503 with Retry-After, has its rate cut
// (multiplicative decrease: to throttleDecrease of the rate it accepted in
// the last second) and then grown back by a fixed step every second
// without a cut (additive increase); a minute without a cut lifts the cut
// altogether. A storm, cuts in a row with no 2xx between them (the
// endpoint refused even the lowered rate: an outage, not a capacity
// limit), is undone faster: from the first 2xx to a request sent after
// the last cut the rate doubles each second (slow start), and once it
// reaches the rate the endpoint accepted before the storm, the rate in
// force before the storm comes back (no limit, or RateLimit). Its Retry-After pauses every POST of the
// subscription until it passes (the caller caps it). The settlers
// retry a throttled event in place: it spends no MaxDeliver attempt and
// counts as no breaker failure (attempt.VerdictThrottle).

const (
	// throttleDecrease is the multiplicative decrease of a cut.
	throttleDecrease = 0.75
	// throttleMinRate is the lowest rate a cut goes to (requests/s).
	throttleMinRate = 0.2
	// throttleMinStep is the least additive increase per second.
	throttleMinStep = 0.5
	// throttleStepShare is the additive increase per second as a share
	// of the rate at the last cut.
	throttleStepShare = 0.2
	// throttleLift is how long without a cut lifts the cut (back to the
	// subscription's RateLimit, or no limit).
	throttleLift = time.Minute
)

// Throttle is one subscription's rate limiter with AIMD and Retry-After.
// It is safe for concurrent use; a nil *Throttle holds nothing. Its time
// is the engine's clock.
type Throttle struct {
	clock   clockwork.Clock
	ceiling rate.Limit // Subscription.RateLimit, or rate.Inf
	gauge   prometheus.Gauge

	mu    sync.Mutex
	lim   *rate.Limiter
	cur   rate.Limit // the rate in force: ceiling, or a cut one below it
	atCut rate.Limit // the rate a cut set, for the step
	// A storm (see above): cuts counts the cuts since the last 2xx to a
	// request sent after a cut; before is the rate in force before the
	// storm's first cut and base the rate the endpoint accepted then;
	// acceptedCut is whether a request sent after the last cut was
	// answered 2xx (slow start runs from then).
	cuts        int
	before      rate.Limit
	base        rate.Limit
	acceptedCut bool
	lastCut     time.Time
	lastInc     time.Time
	paused      time.Time // no POST before (Retry-After)
	gen         uint64    // cuts so far
	// sent and accepted count this second's POSTs and 2xx answers; prev*
	// the last second's.
	second                 time.Time
	sent, accepted         int
	prevSent, prevAccepted int
}

// New returns the throttle of a subscription with limit requests/s (0:
// no limit) on clock; gauge (nil: none) shows the rate in force.
func New(clock clockwork.Clock, limit float64, gauge prometheus.Gauge) *Throttle {
	ceiling := rate.Inf
	if limit > 0 {
		ceiling = rate.Limit(limit)
	}
	t := &Throttle{clock: clock, ceiling: ceiling, cur: ceiling, lim: rate.NewLimiter(ceiling, 1), gauge: gauge}
	t.show()
	return t
}

// NewRateGauge returns jsbridge_consumer_rate_limit{subscription},
// registered on reg (nil: not registered).
func NewRateGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_rate_limit",
		Help: "Requests per second a subscription's POSTs are held to on this replica: its rate_limit, or lower after a 429 (0: no limit), by subscription.",
	}, []string{"subscription"})
	if reg == nil {
		return g, nil
	}
	return promreg.Register(reg, g)
}

// show sets the gauge to the rate in force, 0 for none (t.mu held or
// not shared yet).
func (t *Throttle) show() {
	if t.gauge == nil {
		return
	}
	if t.cur == rate.Inf {
		t.gauge.Set(0)
		return
	}
	t.gauge.Set(float64(t.cur))
}

// Wait blocks until a POST may go: after any Retry-After pause and within
// the rate. It returns the generation to hand to Observe with the answer,
// or ctx's error if ctx ends first. A wait that a cut overtook waits again
// at the cut rate.
func (t *Throttle) Wait(ctx context.Context) (uint64, error) {
	if t == nil {
		return 0, ctx.Err()
	}
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t.mu.Lock()
		now := t.clock.Now()
		if now.Before(t.paused) {
			d := t.paused.Sub(now)
			t.mu.Unlock()
			sleep(ctx, t.clock, d)
			continue
		}
		t.grow(now)
		gen := t.gen
		d := t.lim.ReserveN(now, 1).DelayFrom(now)
		t.count(now, true, false)
		t.mu.Unlock()
		if d <= 0 {
			return gen, nil
		}
		sleep(ctx, t.clock, d)
		t.mu.Lock()
		cut := t.gen != gen
		t.mu.Unlock()
		if !cut {
			return gen, ctx.Err()
		}
	}
}

// Answer is what the throttle takes from the answer to a POST.
type Answer struct {
	// Accepted: a 2xx.
	Accepted bool
	// Throttled: a throttling answer (attempt.VerdictThrottle: 429, or
	// 503 with Retry-After).
	Throttled bool
	// RetryAfter is the pause a throttling answer asks for, capped by the
	// caller (<= 0: none).
	RetryAfter time.Duration
}

// Observe takes an answer into account: a 2xx counts as accepted; a
// throttling answer cuts the rate and its Retry-After pauses the
// subscription. It reports whether the answer was a throttling one. gen
// is Wait's generation when the request was sent: an answer to a request
// sent before the last cut cuts no more (one cut per round, as TCP's
// congestion control).
func (t *Throttle) Observe(gen uint64, a Answer) bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	switch {
	case a.Accepted:
		t.count(now, false, true)
		if gen == t.gen && !t.acceptedCut && !t.lastCut.IsZero() {
			t.grow(now) // the seconds before it: additive
			t.acceptedCut = true
			if t.cuts >= 2 {
				t.lastInc = now // slow start counts from the first 2xx
			} else {
				t.cuts = 0 // one cut the endpoint then accepted: no storm
			}
		}
		return false
	case a.Throttled:
	default:
		return false
	}
	if a.RetryAfter > 0 {
		if until := now.Add(a.RetryAfter); until.After(t.paused) {
			t.paused = until
		}
	}
	if gen != t.gen {
		// Sent before the last cut: that cut already answered it.
		return true
	}
	t.count(now, false, false)
	base := t.cur
	if t.cuts == 0 || t.acceptedCut {
		// The first cut of a storm: what slow start restores.
		t.cuts, t.before = 0, t.cur
		t.base = rate.Limit(max(t.accepted, t.prevAccepted))
		if t.base == 0 || t.base > t.cur {
			t.base = t.cur
		}
	}
	t.cuts++
	if base == rate.Inf {
		// The first cut: from the rate the endpoint accepted, or half
		// the rate sent when it accepted none.
		base = rate.Limit(max(t.accepted, t.prevAccepted))
		if base == 0 {
			base = rate.Limit(max(t.sent, t.prevSent)) / 2
		}
	}
	next := max(base*throttleDecrease, throttleMinRate)
	// A new limiter: the waits reserved at the old rate are
	t.cur = min(next, t.ceiling)
	// void (wait reserves again when it sees the cut), and the next POST
	// goes one interval of the new rate after the cut.
	t.lim = rate.NewLimiter(t.cur, 1)
	t.lim.ReserveN(now, 1)
	t.show()
	t.atCut, t.lastCut, t.lastInc, t.acceptedCut = t.cur, now, now, false
	t.gen++
	return true
}

// grow applies the additive increase due at now (t.mu held).
func (t *Throttle) grow(now time.Time) {
	if t.cur == t.ceiling || t.lastCut.IsZero() {
		return
	}
	if now.Sub(t.lastCut) >= throttleLift {
		t.cuts = 0
		t.setRate(now, t.ceiling)
		return
	}
	secs := math.Floor(now.Sub(t.lastInc).Seconds())
	if secs < 1 {
		return
	}
	t.lastInc = t.lastInc.Add(time.Duration(secs) * time.Second)
	if t.cuts >= 2 && t.acceptedCut {
		// Slow start after a storm: double each second; at the rate
		// accepted before the storm, back to the rate in force then.
		r := t.cur * rate.Limit(math.Pow(2, secs))
		if r >= t.base {
			t.cuts = 0
			t.setRate(now, min(t.before, t.ceiling))
			return
		}
		t.setRate(now, r)
		return
	}
	step := max(throttleMinStep, float64(t.atCut)*throttleStepShare)
	t.setRate(now, min(t.cur+rate.Limit(secs*step), t.ceiling))
}

// setRate sets the rate in force (t.mu held).
func (t *Throttle) setRate(now time.Time, r rate.Limit) {
	t.cur = r
	t.lim.SetLimitAt(now, r)
	t.show()
}

// count counts a POST sent or an answer accepted in now's second (t.mu
// held); with neither it only rolls the seconds.
func (t *Throttle) count(now time.Time, sent, accepted bool) {
	sec := now.Truncate(time.Second)
	if !sec.Equal(t.second) {
		if sec.Sub(t.second) == time.Second {
			t.prevSent, t.prevAccepted = t.sent, t.accepted
		} else {
			t.prevSent, t.prevAccepted = 0, 0
		}
		t.second, t.sent, t.accepted = sec, 0, 0
	}
	if sent {
		t.sent++
	}
	if accepted {
		t.accepted++
	}
}

// Rate returns the rate in force in requests/s (+Inf: none).
func (t *Throttle) Rate() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur == rate.Inf {
		return math.Inf(1)
	}
	return float64(t.cur)
}
