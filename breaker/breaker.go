// Package breaker holds the consumer's circuit breakers: one per webhook
// endpoint (sony/gobreaker v2), with their transitions logged and exported as
// Prometheus metrics. While an endpoint's breaker is open the consumer stops
// pulling for the subscriptions that deliver to it, so no delivery attempts
// are spent on an endpoint that is down.
//
// It is part of the engine behind the consumer front door, not an
// application API: applications configure breakers through package
// consumer (its Config), and this package keeps only the surface the
// consumer needs. It may change between releases (see docs/embedding.md's API
// stability section).
package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// ErrOpen is returned (wrapping gobreaker.ErrOpenState or
// gobreaker.ErrTooManyRequests) by Breaker.Execute when the breaker rejects
// the call without running it: the breaker is open, or it is half-open and
// its probes are already taken. A rejected call is not an endpoint failure.
var ErrOpen = errors.New("circuit breaker open")

// ErrExcluded, wrapped by the error of the function Breaker.Execute runs,
// keeps the call out of the counts: neither a success nor a failure (an
// endpoint asking to slow down says nothing about whether it is up).
var ErrExcluded = errors.New("not counted by the circuit breaker")

// ErrInvalidConfig is wrapped by NewSet when a Settings field is out of
// range; the message names the field and the value.
var ErrInvalidConfig = errors.New("invalid breaker settings")

// State is a breaker's state. Its integer values are the values of the
// jsbridge_consumer_breaker_state gauge.
type State int

const (
	// Closed lets every call through and counts failures.
	Closed State = 0
	// HalfOpen lets Settings.HalfOpenProbes calls through after the open
	// timeout; their successes close the breaker, a failure re-opens it.
	HalfOpen State = 1
	// Open rejects every call with ErrOpen until the open timeout elapses.
	Open State = 2
)

// String returns "closed", "half-open" or "open" (the metric label values).
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	default:
		return fmt.Sprintf("state(%d)", int(s))
	}
}

// newCircuitBreaker returns a new (closed) local breaker for b.
func (b *Breaker) newCircuitBreaker() *gobreaker.CircuitBreaker[struct{}] {
	st := b.settings
	return gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        b.name,
		MaxRequests: st.HalfOpenProbes,
		Interval:    st.Interval,
		Timeout:     st.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= st.ConsecutiveFailures {
				return true
			}
			n := c.Requests - min(c.Requests, c.TotalExclusions)
			return n >= st.MinRequests && float64(c.TotalFailures)/float64(n) >= st.FailureRatio
		},
		OnStateChange: b.onStateChange,
		IsExcluded:    isExcluded,
	})
}

// Endpoint renders a webhook URL as breakers key it and as it appears in
// logs and metric labels: scheme://host[:port]/path, without userinfo,
// query or fragment, so no secret a URL may carry leaks. An unparsable URL
// renders as "invalid-url".
func Endpoint(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "invalid-url"
	}
	clean := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return clean.String()
}

// isExcluded keeps cancelled calls out of the counts (a consumer shutting
// down says nothing about the endpoint), and calls failing with
// ErrExcluded.
func isExcluded(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrExcluded)
}

// Breaker is the circuit breaker of one endpoint. It is safe for concurrent
// use.
type Breaker struct {
	name     string
	settings Settings
	set      *Set
	cb       atomic.Pointer[gobreaker.CircuitBreaker[struct{}]]
	sh       *shared // nil unless the Set shares its breakers

	mu       sync.Mutex
	openedAt time.Time
	changed  chan struct{}
}

// Endpoint returns the endpoint the breaker guards, as Endpoint renders it.
func (b *Breaker) Endpoint() string { return b.name }

// Execute runs fn unless the breaker rejects it, and counts fn's result: a
// nil error is a success, an error wrapping context.Canceled is neither,
// an error wrapping ErrExcluded neither, any other error is a failure. When the breaker rejects the call, fn does
// not run and Execute returns an error wrapping ErrOpen (and gobreaker's
// ErrOpenState or ErrTooManyRequests). Otherwise it returns fn's error.
func (b *Breaker) Execute(fn func() error) error {
	if b.sh != nil {
		if st, ok := b.sh.state(time.Now()); ok {
			return b.executeShared(st, fn)
		}
	}
	_, err := b.cb.Load().Execute(func() (struct{}, error) { return struct{}{}, fn() })
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return fmt.Errorf("%w: %s: %w", ErrOpen, b.name, err)
	}
	return err
}

// executeShared runs fn as the shared state st allows: not while open; as
// the probe while half-open, if this process holds the probe claim (or
// takes it) and has a probe slot free. The probe's result is written to
// the store.
func (b *Breaker) executeShared(st State, fn func() error) error {
	if st == Open {
		return fmt.Errorf("%w: %s: %w", ErrOpen, b.name, gobreaker.ErrOpenState)
	}
	if !b.sh.claim() {
		return fmt.Errorf("%w: %s: %w", ErrOpen, b.name, gobreaker.ErrTooManyRequests)
	}
	if !b.sh.begin() {
		return fmt.Errorf("%w: %s: %w", ErrOpen, b.name, gobreaker.ErrTooManyRequests)
	}
	err := fn()
	b.sh.settle(err) // before the slot is free: no second probe sees the old claim
	b.sh.end()
	// This process probed for every replica: the probe's outcome is the
	// shared breaker's transition, exported as the local breaker's would
	// be (the local breaker records its own move to half-open).
	switch {
	case err == nil:
		b.record(HalfOpen, Closed)
		b.reset()
	case isExcluded(err):
		b.signal()
	default:
		b.record(HalfOpen, Open)
		b.signal()
	}
	return err
}

// reset replaces the local breaker with a closed one (the shared state
// closed) and wakes the waiters.
func (b *Breaker) reset() {
	if State(b.cb.Load().State()) != Closed {
		b.cb.Store(b.newCircuitBreaker())
		b.set.logger.Info("circuit breaker closed by a probe of the shared state", slog.String("endpoint", b.name))
	}
	b.set.state.WithLabelValues(b.name).Set(float64(Closed))
	b.signal()
}

// signal wakes the waiters of Changed.
func (b *Breaker) signal() {
	b.mu.Lock()
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// State returns the breaker's state: the shared state's while it is open
// or half-open (Open too while another process holds the probe), else
// the local one. An open breaker whose open timeout has elapsed reports
// (and becomes) HalfOpen.
func (b *Breaker) State() State {
	if b.sh != nil {
		if st, ok := b.sh.state(time.Now()); ok {
			return st
		}
	}
	return State(b.cb.Load().State())
}

// Ready reports whether calls may be attempted: false while the breaker is
// open and its open timeout has not elapsed. The consumer stops pulling for
// an endpoint that is not ready.
func (b *Breaker) Ready() bool {
	return b.State() != Open
}

// OpenTimeout returns how long the breaker stays open (Settings.OpenTimeout).
func (b *Breaker) OpenTimeout() time.Duration { return b.settings.OpenTimeout }

// Changed returns a channel that is closed at the breaker's next state
// transition. The move from open to half-open happens when the breaker is
// next used or asked for its State, so use Wait to wait for it.
func (b *Breaker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// probePoll bounds how long Wait sleeps while a half-open breaker's probes
// are taken: a probe ending without a verdict (cancelled) frees its slot
// without a transition.
const probePoll = 50 * time.Millisecond

// Wait blocks until a call may go through: the breaker is closed, or
// half-open with a probe free. It returns ctx's error if ctx ends first.
// Several waiters may be released for one probe; the losers get ErrOpen
// from Execute.
func (b *Breaker) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		changed := b.Changed()
		var wait time.Duration
		if b.sh != nil {
			if st, ok := b.sh.state(time.Now()); ok {
				if st == HalfOpen && b.sh.free() && b.sh.claim() {
					return nil
				}
				wait = max(time.Until(b.sh.until()), probePoll) + time.Millisecond
				if !b.sleep(ctx, changed, wait) {
					return ctx.Err()
				}
				continue
			}
		}
		switch b.State() {
		case Closed:
			return nil
		case HalfOpen:
			c := b.cb.Load().Counts()
			if c.Requests-min(c.Requests, c.TotalExclusions) < b.settings.HalfOpenProbes {
				return nil
			}
			wait = probePoll
		case Open:
			b.mu.Lock()
			wait = time.Until(b.openedAt.Add(b.settings.OpenTimeout))
			b.mu.Unlock()
			// gobreaker goes half-open only strictly after the timeout.
			wait += time.Millisecond
		}
		if !b.sleep(ctx, changed, wait) {
			return ctx.Err()
		}
	}
}

// sleep waits for wait (at least a millisecond), changed or ctx's end; it
// reports false when ctx ended.
func (b *Breaker) sleep(ctx context.Context, changed <-chan struct{}, wait time.Duration) bool {
	t := time.NewTimer(max(wait, time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-t.C:
	}
	return true
}

// onStateChange runs under gobreaker's lock: it must not call into b.cb.
func (b *Breaker) onStateChange(_ string, from, to gobreaker.State) {
	f, t := State(from), State(to)
	b.mu.Lock()
	if t == Open {
		b.openedAt = time.Now()
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
	if t == Open && b.sh != nil {
		go b.sh.tripped() // not under gobreaker's lock
	}
	b.record(f, t)
}

// record exports and logs a transition from f to t: the local breaker's,
// or a shared probe's (executeShared).
func (b *Breaker) record(f, t State) {
	b.set.state.WithLabelValues(b.name).Set(float64(t))
	b.set.trans.WithLabelValues(b.name, f.String(), t.String()).Inc()
	lvl := slog.LevelInfo
	if t == Open {
		lvl = slog.LevelWarn
	}
	b.set.logger.Log(context.Background(), lvl, "circuit breaker transition",
		slog.String("endpoint", b.name), slog.String("from", f.String()), slog.String("to", t.String()))
}
