package lifecycle

import (
	"context"
	"sync"
)

// Part is a long-running part of the engine: the one contract every
// such part has (shaped after River's startstop), and what StartAll and
// StopAll take.
//
//   - Start opens what the part needs (bounded by ctx) and runs it in the
//     background until Stop; it returns the opening's error, or nil once
//     the part runs or while it runs already;
//   - Stop ends the run and returns once the part and every goroutine it
//     started are gone; Stop before Start, or twice, returns at once;
//   - Started is closed once the run began (or the opening failed);
//     Stopped once the run ended (after Stop, or a failed Start). A
//     part may be started again after Stop.
type Part interface {
	Start(ctx context.Context) error
	Stop()
	Started() <-chan struct{}
	Stopped() <-chan struct{}
}

// Service is the life cycle behind a Part (embedded through Base, or a
// field when the part also runs in the foreground): its Start calls
// Service.Start with its opening and its run, its Stop and Stopped are
// Service's. The zero Service is ready; its methods are safe for
// concurrent use, in any order and any number of times.
type Service struct {
	// mu guards the fields; Stop holds it while it waits, so a Start
	// during a Stop starts after it.
	mu      sync.Mutex
	running bool
	cancel  context.CancelFunc
	started chan struct{} // closed once the run began, or the opening failed
	stopped chan struct{} // closed once the run ended, or the opening failed

	errMu sync.Mutex // not mu: a run ends while Stop holds mu
	err   error      // the last run's result
}

// Start calls open (nil: none) in the caller's goroutine with a context
// that ends with ctx or Stop, then run in a new goroutine with a context
// that Stop alone ends (it keeps ctx's values). It returns open's error
// (the Service is then stopped: Stopped is closed and Start may be
// called again), or nil once run is under way or when the Service runs
// already (a second Start is a no-op). run should return when its
// context ends; what it returns is Err's.
func (s *Service) Start(ctx context.Context, open, run func(context.Context) error) error {
	r, ok := s.begin(context.WithoutCancel(ctx))
	if !ok {
		return nil
	}
	if err := s.open(ctx, r, open); err != nil {
		return err
	}
	go s.run(r, run)
	return nil
}

// Run is Start in the foreground: open, then run in the caller's
// goroutine with a context that ends with ctx or Stop; it returns run's
// error or open's, or ErrAlreadyStarted when the Service runs already.
func (s *Service) Run(ctx context.Context, open, run func(context.Context) error) error {
	r, ok := s.begin(ctx)
	if !ok {
		return ErrAlreadyStarted
	}
	if err := s.open(ctx, r, open); err != nil {
		return err
	}
	s.run(r, run)
	return s.Err()
}

// aRun is one run of a Service: its context and channels.
type aRun struct {
	ctx              context.Context
	cancel           context.CancelFunc
	started, stopped chan struct{}
}

// begin marks the Service running and returns its run (its context
// from parent), or ok false when it runs already.
func (s *Service) begin(parent context.Context) (aRun, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running && !closed(s.stopped) {
		return aRun{}, false
	}
	runCtx, cancel := context.WithCancel(parent)
	if s.started == nil || closed(s.started) {
		s.started = make(chan struct{})
	}
	if s.stopped == nil || closed(s.stopped) {
		s.stopped = make(chan struct{})
	}
	s.running, s.cancel = true, cancel
	return aRun{ctx: runCtx, cancel: cancel, started: s.started, stopped: s.stopped}, true
}

// open calls open (nil: none) with a context that ends with ctx or r's;
// when it fails the run is over before it began.
func (s *Service) open(ctx context.Context, r aRun, open func(context.Context) error) error {
	if open == nil {
		return nil
	}
	openCtx, cancelOpen := context.WithCancel(ctx)
	unhook := context.AfterFunc(r.ctx, cancelOpen) // Stop ends the opening
	err := open(openCtx)
	unhook()
	cancelOpen()
	if err != nil {
		s.errMu.Lock()
		s.err = err
		s.errMu.Unlock()
		r.cancel()
		close(r.started)
		close(r.stopped)
	}
	return err
}

// run runs run and records its result.
func (s *Service) run(r aRun, run func(context.Context) error) {
	defer close(r.stopped)
	defer r.cancel()
	close(r.started)
	err := run(r.ctx)
	s.errMu.Lock()
	s.err = err
	s.errMu.Unlock()
}

// Stop ends the run's context (or the opening's) and waits until the
// run returned. Stop before Start, or once stopped, returns at once.
func (s *Service) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return
	}
	s.cancel()
	<-s.stopped
	s.running = false
}

// Started is closed once the run began (or the opening failed). Before
// Start it is the channel the next Start closes.
func (s *Service) Started() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started == nil {
		s.started = make(chan struct{})
	}
	return s.started
}

// Stopped is closed once the run ended (or the opening failed). Before
// Start it is the channel the next run's end closes.
func (s *Service) Stopped() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped == nil {
		s.stopped = make(chan struct{})
	}
	return s.stopped
}

// Err returns what the last run returned (read it once Stopped is
// closed).
func (s *Service) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// StartAll starts parts in order; when one fails it stops the ones
// started (in reverse order) and returns its error.
func StartAll(ctx context.Context, parts ...Part) error {
	for i, p := range parts {
		if err := p.Start(ctx); err != nil {
			StopAll(parts[:i]...)
			return err
		}
	}
	return nil
}

// StopAll stops parts in reverse order (the last started first), each
// once the one after it stopped.
func StopAll(parts ...Part) {
	for i := len(parts) - 1; i >= 0; i-- {
		parts[i].Stop()
	}
}

// closed reports whether c is closed (nil: no).
func closed(c chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Base is what a Part embeds for its Stop, Started and Stopped (a
// Service's). The part writes its own Start(ctx), which calls
// Base.Start with its opening and run; that Start shadows Base's, so
// only Start(ctx) meets the Part interface, and Service's Run and Err
// are not promoted.
type Base struct{ life Service }

// Start is Service.Start: the part's own Start calls it.
func (b *Base) Start(ctx context.Context, open, run func(context.Context) error) error {
	return b.life.Start(ctx, open, run)
}

// Stop is Service.Stop.
func (b *Base) Stop() { b.life.Stop() }

// Started is Service.Started.
func (b *Base) Started() <-chan struct{} { return b.life.Started() }

// Stopped is Service.Stopped.
func (b *Base) Stopped() <-chan struct{} { return b.life.Stopped() }

// Func is a Part made of one run function (River's StartStopFunc): Start
// runs it in the background with a context that Stop ends.
type Func struct {
	Base
	run func(context.Context) error
}

// NewFunc returns the Part that runs run.
func NewFunc(run func(ctx context.Context) error) *Func { return &Func{run: run} }

// Start runs the function in the background (Service.Start); it returns
// nil.
func (f *Func) Start(ctx context.Context) error { return f.Base.Start(ctx, nil, f.run) }
