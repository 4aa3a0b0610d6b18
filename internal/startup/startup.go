// Package startup waits for a binary's dependencies when it starts:
// Postgres, NATS, the JetStream streams and durable consumers. Deployments
// start in any order, so a dependency that is not up yet is waited for,
// not fatal: each step is tried until it succeeds, with capped, jittered
// backoff (0.5 s doubling to 15 s, ±20 %) and one warning per attempt
// saying what is missing, while /readyz names the step waited for (Check).
// A step gives up only on an error marked permanent (bad credentials, bad
// configuration, an incompatible existing stream: what waiting cannot
// fix), when the start-up timeout passes (if one is set), or when the
// binary is stopped.
package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/internal/backoff"
)

// ErrTimeout is wrapped by Waiter.For when the start-up timeout passes
// before the step succeeded; the message names the step and its last error.
var ErrTimeout = errors.New("start-up timeout")

// permanentError marks an error waiting cannot fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one waiting cannot fix (bad credentials, bad
// configuration): Waiter.For returns it at once instead of trying again.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err (or an error it wraps) was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// Waiter runs a binary's start-up steps, waiting for each dependency, and
// reports the one it waits for to /readyz through Check. Create it with New
// when the binary starts: the start-up timeout counts from then.
type Waiter struct {
	log      *slog.Logger
	timeout  time.Duration
	deadline time.Time // zero: none
	min, max time.Duration

	mu      sync.Mutex
	waiting string // the step waited for; "" between steps
	last    error  // its last error
	ready   bool
}

// New returns a Waiter logging to log (nil: discard). timeout bounds the
// whole start-up (every step together); 0 or less waits forever.
func New(log *slog.Logger, timeout time.Duration) *Waiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Waiter{log: log, timeout: timeout, min: backoff.DefaultMin, max: backoff.DefaultMax}
	if timeout > 0 {
		w.deadline = time.Now().Add(timeout)
	}
	return w
}

// SetBackoff changes the pauses between attempts (tests): from min
// doubling to max, ±20 %.
func (w *Waiter) SetBackoff(min, max time.Duration) { w.min, w.max = min, max }

// For runs try until it returns nil, and returns nil. what names the
// dependency for logs, /readyz and errors ("NATS at nats://host:4222",
// "JetStream stream EVENTS"). Each failed attempt is logged once, at warn
// level ("waiting for <what>", with the error, the attempt number and the
// pause), and followed by a pause of the backoff. For returns early:
//   - the error itself when try's error is marked Permanent;
//   - an error wrapping ErrTimeout, naming what and the last error, when the
//     start-up timeout passes;
//   - an error wrapping ctx's error when ctx ends (the binary is stopped).
//
// try's context ends at the start-up deadline; try bounds its own attempt
// where a dependency may not answer at all.
func (w *Waiter) For(ctx context.Context, what string, try func(ctx context.Context) error) error {
	bo := backoff.Backoff{Min: w.min, Max: w.max}
	var last error
	for attempt := 1; ; attempt++ {
		actx, cancel := w.attemptContext(ctx)
		err := try(actx)
		cancel()
		if err == nil {
			w.set("", nil)
			if attempt > 1 {
				w.log.Info(what+" is available", "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while waiting for %s: %w", what, ctx.Err())
		}
		if IsPermanent(err) {
			w.set(what, err)
			return err
		}
		// An attempt cut short by the start-up deadline says nothing new:
		// report the one before it.
		if last == nil || !w.expired() {
			last = err
		}
		w.set(what, last)
		if w.expired() {
			return fmt.Errorf("%w: --startup-timeout %s passed while still waiting for %s: %v", ErrTimeout, w.timeout, what, last)
		}
		pause := bo.Next()
		if !w.deadline.IsZero() {
			pause = min(pause, max(time.Until(w.deadline), 0))
		}
		w.log.Warn("waiting for "+what, "error", err, "attempt", attempt, "retry_in", pause.Round(time.Millisecond))
		if !backoff.Sleep(ctx, pause) {
			return fmt.Errorf("stopped while waiting for %s: %w", what, ctx.Err())
		}
	}
}

func (w *Waiter) attemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if w.deadline.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, w.deadline)
}

func (w *Waiter) expired() bool {
	return !w.deadline.IsZero() && !time.Now().Before(w.deadline)
}

func (w *Waiter) set(what string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting, w.last = what, err
}

// Ready marks the start-up as complete: Check passes from then on.
func (w *Waiter) Ready() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready, w.waiting, w.last = true, "", nil
}

// Check is a readiness check (an ops.Check): nil once Ready was called,
// else an error naming the step waited for and its last error ("waiting
// for NATS at nats://127.0.0.1:4222: nats: no servers available for
// connection"), or "starting" between steps.
func (w *Waiter) Check(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.ready:
		return nil
	case w.waiting == "":
		return errors.New("starting")
	case w.last == nil:
		return fmt.Errorf("waiting for %s", w.waiting)
	default:
		return fmt.Errorf("waiting for %s: %w", w.waiting, w.last)
	}
}

// waiterKey carries a Waiter in a context.
type waiterKey struct{}

// WithWaiter returns ctx carrying w, so that a public package's Provision
// (consumer.Consumer.Provision) waits with the binary's Waiter: one
// --startup-timeout deadline, one /readyz state and the same messages for
// every step, whether the binary or the package takes it.
func WithWaiter(ctx context.Context, w *Waiter) context.Context {
	return context.WithValue(ctx, waiterKey{}, w)
}

// WaiterFrom returns the Waiter WithWaiter put in ctx, or nil.
func WaiterFrom(ctx context.Context) *Waiter {
	w, _ := ctx.Value(waiterKey{}).(*Waiter)
	return w
}
