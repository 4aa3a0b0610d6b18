package shared

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/lifecycle"
)

const (
	// catchUpPoll bounds the wait for a live event while a subscription
	// has a cursor to read: the cursors' rounds run between events.
	catchUpPoll = 200 * time.Millisecond
	// readPause is the pause after a reader error (ErrBehind, a catch-up
	// that cannot reach its target) before Next is called again.
	readPause = 100 * time.Millisecond
	// firstRoundWait bounds how long the first claimed partition waits
	// for the others the owner claimed with it before the reader opens.
	firstRoundWait = time.Second
)

// request asks the dispatch loop to take partition p from just after
// floor, handing its events to fan, or (release) to release it from fan.
// done receives the answer (buffered: the loop never waits for the
// asker).
type request struct {
	p       int
	floor   uint64
	fan     *fanout.Partition
	release bool
	done    chan error
}

// loop is the replica's dispatch loop: the one goroutine that drives the
// reader (reader.Reader is not safe for concurrent use, and that keeps
// the head still while a partition is taken), dispatches each event to
// its partition's fan-out, and runs the fan-outs' cursors between
// events. The claims talk to it by requests (take, release); a request
// interrupts a Next waiting for an event.
type loop struct {
	lifecycle.Base

	js    jetstream.JetStream
	cfg   reader.Config
	log   *slog.Logger
	clock clockwork.Clock
	// claimed returns how many partitions the owner holds: the reader
	// opens once that many were asked to be taken (the owner's first
	// round), or after firstRoundWait.
	claimed func() int
	// warn paces the read errors, which repeat every readPause.
	warn *owner.WarnPace

	mu        sync.Mutex
	pending   []request
	interrupt context.CancelFunc // the running Next's, nil when none
	wake      chan struct{}      // capacity 1

	// wait is the context of the waits for a live event while no cursor
	// reads, kept from one event to the next until a request, a poke or
	// the loop's end cancels it (stopWait): a context made for every
	// event cost three allocations and a registration in the loop's
	// context, a few µs an event. Only the loop uses them.
	wait     context.Context
	stopWait context.CancelFunc
}

func newLoop(arch *base.Archetype, js jetstream.JetStream, cfg reader.Config, claimed func() int) *loop {
	return &loop{js: js, cfg: cfg, log: arch.Logger, clock: arch.Clock, claimed: claimed, warn: owner.NewWarnPace(arch.Clock),
		wake: make(chan struct{}, 1)}
}

// Start runs the loop in the background until Stop (lifecycle.Part),
// which ends it and its reader.
func (l *loop) Start(ctx context.Context) error {
	return l.Base.Start(ctx, nil, func(ctx context.Context) error { l.run(ctx); return nil })
}

// take asks the loop to take partition p from just after floor for fan
// and waits for the answer (reader.Take's error, or the reader's opening
// error), ctx's end or the loop's.
func (l *loop) take(ctx context.Context, p int, floor uint64, fan *fanout.Partition) error {
	done := l.ask(request{p: p, floor: floor, fan: fan})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-l.Stopped():
		return fmt.Errorf("shared: the dispatch loop stopped")
	}
}

// release asks the loop to release partition p from fan and waits until
// it did (from then on no event of p is dispatched to fan) or the loop
// ended. A partition taken since by another claim (for another fan) is
// left as it is.
func (l *loop) release(p int, fan *fanout.Partition) {
	done := l.ask(request{p: p, fan: fan, release: true})
	select {
	case <-done:
	case <-l.Stopped():
	}
}

func (l *loop) ask(req request) chan error {
	req.done = make(chan error, 1)
	l.mu.Lock()
	l.pending = append(l.pending, req)
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return req.done
}

// poke has the loop run the cursors' round now: a Next waiting for an
// event is interrupted (a subscription just got a cursor to read, by a
// Join or a resume, and the loop waits without a bound while no cursor
// reads).
func (l *loop) poke() {
	l.mu.Lock()
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// asked reports whether a request waits.
func (l *loop) asked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) > 0
}

// requests returns the requests asked since the last call.
func (l *loop) requests() []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	reqs := l.pending
	l.pending = nil
	return reqs
}

// run is the loop, until ctx ends.
func (l *loop) run(ctx context.Context) {
	var rd *reader.Reader
	defer func() {
		if rd != nil {
			rd.Stop()
		}
		if l.stopWait != nil {
			l.stopWait()
			l.wait, l.stopWait = nil, nil
		}
	}()
	live := map[int]*fanout.Partition{}
	for ctx.Err() == nil {
		reqs := l.requests()
		if rd == nil && hasTake(reqs) {
			reqs = l.firstRound(ctx, reqs)
			var err error
			if rd, err = reader.Open(ctx, l.js, l.cfg, lowestFloor(reqs)+1); err != nil {
				l.log.Warn("shared: open the reader", slog.Any("error", err))
				rd = nil
			}
		}
		for _, req := range reqs {
			req.done <- l.apply(rd, live, req)
		}
		if rd == nil {
			select {
			case <-l.wake:
			case <-ctx.Done():
			}
			continue
		}
		l.next(ctx, rd, live)
	}
}

// firstRound waits, at most firstRoundWait, for the take requests of
// every partition the owner claimed so far, so that the reader opens from
// the lowest floor of the first round and none of them needs a catch-up.
func (l *loop) firstRound(ctx context.Context, reqs []request) []request {
	timeout := l.clock.NewTimer(firstRoundWait)
	defer timeout.Stop()
	for takes(reqs) < l.claimed() {
		select {
		case <-l.wake:
			reqs = append(reqs, l.requests()...)
		case <-timeout.Chan():
			return reqs
		case <-ctx.Done():
			return reqs
		}
	}
	return reqs
}

// apply takes or releases a partition on the reader (rd nil: the reader
// could not be opened). The releases and takes of one partition's claims
// may come in any order: a release only releases its own claim's fan.
func (l *loop) apply(rd *reader.Reader, live map[int]*fanout.Partition, req request) error {
	held := live[req.p]
	if req.release {
		if held == req.fan {
			if rd != nil {
				rd.Release(req.p)
			}
			delete(live, req.p)
		}
		return nil
	}
	if rd == nil {
		return fmt.Errorf("shared: partition %d: no reader", req.p)
	}
	if held != nil {
		// A former claim of the partition, lost, has not asked for its
		// release yet (a lost lease can be claimed again before the
		// former claim is Done): the new claim replaces it.
		rd.Release(req.p)
		delete(live, req.p)
	}
	if err := rd.Take(req.p, req.floor); err != nil {
		return fmt.Errorf("shared: take partition %d: %w", req.p, err)
	}
	live[req.p] = req.fan
	return nil
}

// next runs one round of the cursors, then waits for the reader's next
// event (bounded by catchUpPoll while a cursor reads) and dispatches it.
// A request interrupts the wait, and ends the round between two
// partitions' cursor reads: a partition just claimed is taken before the
// others' cursors read on (each read is a batch of direct gets; with a
// few partitions behind, a round of them held a survivor's takes for
// seconds after a replica died).
func (l *loop) next(ctx context.Context, rd *reader.Reader, live map[int]*fanout.Partition) {
	behind := 0
	for p, fan := range live {
		if l.asked() {
			return
		}
		n, err := fan.CatchUp(ctx)
		if err != nil && ctx.Err() == nil {
			l.warn.Warn(l.log, "cursor", "shared: cursor read", slog.Int("partition", p), slog.Any("error", err))
		}
		behind += n
	}
	var nctx context.Context
	var cancel context.CancelFunc
	if behind > 0 {
		nctx, cancel = context.WithTimeout(ctx, catchUpPoll)
		defer cancel()
	} else {
		if l.wait == nil || l.wait.Err() != nil {
			l.wait, l.stopWait = context.WithCancel(ctx)
		}
		nctx, cancel = l.wait, l.stopWait
	}
	l.mu.Lock()
	if len(l.pending) > 0 {
		l.mu.Unlock()
		return
	}
	select {
	case <-l.wake:
		// Poked while the cursors' round ran (no Next to interrupt):
		// another round first, or what it was poked for waits for an
		// event that may never come.
		l.mu.Unlock()
		return
	default:
	}
	l.interrupt = cancel
	l.mu.Unlock()
	ev, err := rd.Next(nctx)
	l.mu.Lock()
	l.interrupt = nil
	l.mu.Unlock()
	switch {
	case err == nil:
		if fan := live[ev.Partition]; fan != nil {
			fan.Dispatch(ev)
		}
	case nctx.Err() != nil:
		// Interrupted by a request, the cursors' turn, or stopping.
	default:
		l.warn.Warn(l.log, "read", "shared: read the events stream", slog.Any("error", err))
		// A request ends the pause: run finds it in pending.
		select {
		case <-l.clock.After(readPause):
		case <-l.wake:
		case <-ctx.Done():
		}
	}
}

func hasTake(reqs []request) bool { return takes(reqs) > 0 }

func takes(reqs []request) int {
	n := 0
	for _, r := range reqs {
		if !r.release {
			n++
		}
	}
	return n
}

// lowestFloor is the lowest floor of reqs' takes.
func lowestFloor(reqs []request) uint64 {
	var low uint64
	first := true
	for _, r := range reqs {
		if !r.release && (first || r.floor < low) {
			low, first = r.floor, false
		}
	}
	return low
}
