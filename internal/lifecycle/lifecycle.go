// Package lifecycle is the one start/stop life cycle of the project.
// Every long-running part of the consumer engine is a Part (Start in the
// background, a synchronous Stop safe before Start and twice, Stopped
// closed once it ended) that embeds a Base (a Service); its parent
// starts and stops it through that contract (StartAll, StopAll). The front doors
// (bridge, consumer) keep a Runner: run once, in the background (Start)
// or the foreground (Run); Stop cancels the run and waits for it with the
// caller's context.
//
// A Runner's rules:
//   - a Runner runs once: a second Start or Run returns the error given to
//     New (ErrAlreadyStarted by default), also while the first runs;
//   - a setup step that fails leaves the Runner unstarted, so Start may be
//     tried again;
//   - Stop before Start is a no-op returning nil; Stop during setup
//     cancels the setup's context;
//   - Stop waits for the run to return, or for its ctx to end; every Stop
//     once the run returned gives the run's result, so a double Stop is
//     safe.
package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// ErrAlreadyStarted is what Start and Run return on a Runner made with
// New(nil) that runs or ran already.
var ErrAlreadyStarted = errors.New("already started")

// Runner runs one function once and stops it. Its methods are safe for
// concurrent use. Make one with New.
type Runner struct {
	errStarted error

	mu      sync.Mutex
	started bool               // Start or Run was called and its setup has not failed
	cancel  context.CancelFunc // cancels setup and run; nil before Start or Run
	done    chan struct{}      // closed when setup failed or the run returned
	result  error              // the run's error; set before done closes
}

// New returns a Runner whose second Start or Run returns errStarted (nil:
// ErrAlreadyStarted), so each front door keeps its own sentinel.
func New(errStarted error) *Runner {
	if errStarted == nil {
		errStarted = ErrAlreadyStarted
	}
	return &Runner{errStarted: errStarted}
}

// Step is a setup step or a run: it should return when ctx ends.
type Step func(ctx context.Context) error

// Start calls setup (nil: none) in the caller's goroutine, then run in a
// new goroutine, both with a context derived from ctx that Stop cancels.
// It returns setup's error (the Runner is then not started: Start may be
// called again), the Runner's already-started error when it runs or ran,
// or nil once run is under way.
func (r *Runner) Start(ctx context.Context, setup, run Step) error {
	runCtx, err := r.begin(ctx)
	if err != nil {
		return err
	}
	if err := r.setup(runCtx, setup); err != nil {
		return err
	}
	go r.run(runCtx, run)
	return nil
}

// Run is Start in the foreground: setup, then run until it returns (Stop
// or ctx ending it), and it returns run's error, setup's error, or the
// already-started error.
func (r *Runner) Run(ctx context.Context, setup, run Step) error {
	runCtx, err := r.begin(ctx)
	if err != nil {
		return err
	}
	if err := r.setup(runCtx, setup); err != nil {
		return err
	}
	r.run(runCtx, run)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// Stop cancels the context of the setup or run under way and waits until
// the run returned (or the setup failed), or ctx ends. It returns the
// run's error (nil for a setup that failed, or when nothing was started),
// or ctx's error (unwrapped: the front door names itself) when ctx ended first: the run then goes on
// stopping in the background and a later Stop waits again.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.result
	case <-ctx.Done():
		return ctx.Err()
	}
}

// begin marks the Runner started and returns the context of its setup and
// run.
func (r *Runner) begin(ctx context.Context) (context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return nil, r.errStarted
	}
	runCtx, cancel := context.WithCancel(ctx)
	r.started, r.cancel, r.done = true, cancel, make(chan struct{})
	return runCtx, nil
}

// setup runs step; when it fails, the Runner goes back to unstarted and a
// Stop waiting on it returns nil.
func (r *Runner) setup(ctx context.Context, step Step) error {
	if step == nil {
		return nil
	}
	err := step(ctx)
	if err == nil {
		return nil
	}
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.started, r.cancel, r.done, r.result = false, nil, nil, nil
	r.mu.Unlock()
	cancel()
	close(done)
	return err
}

// run runs step and records its result.
func (r *Runner) run(ctx context.Context, step Step) {
	err := step(ctx)
	r.mu.Lock()
	r.result = err
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	cancel() // frees the context; Stop may still call it
	close(done)
}
