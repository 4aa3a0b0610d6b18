package fanout

import (
	"context"
	"sync"
)

// maxIdle is how many workers of a partition may wait for a run at
// once; a worker done while as many wait ends. At 1,000 events/s with
// two subscriptions about 20 runs are under way over the 16 partitions
// of a replica; a backlog's bursts use more, and their workers end as
// they finish.
const maxIdle = 16

// workers runs a partition's lanes and unordered sends on goroutines that
// outlive one run: a run goes to the worker that waited least (its stack
// is the likeliest to be grown still), else to a new goroutine, which
// waits for another run once it is done, unless maxIdle wait already.
// A goroutine started per run began on a small stack and grew it
// (runtime.newstack, copying it) on every attempt's way to its POST: the
// body, the header map, the HTTP client; at 1,000 events/s with two
// subscriptions that was 7-8 % of the consumer's CPU (issue 33), spent
// between the event's dispatch and its POST. A worker keeps the stack
// it grew (the GC halves an idle one's now and then). Bounded by a
// count rather than an idle time: no timer, so the fan-out's clock (a
// fake one in tests, whose timers they count) is not involved.
type workers struct {
	ctx context.Context // the partition's: its end ends the waiting workers
	max int             // maxIdle
	wg  sync.WaitGroup

	mu      sync.Mutex
	waiting []*worker // the last to wait last
	started int       // goroutines started
}

// worker is one waiting goroutine: next receives its next run.
type worker struct {
	next chan func() // capacity 1: handing a run over never blocks
}

func newWorkers(ctx context.Context, maxIdle int) *workers {
	return &workers{ctx: ctx, max: maxIdle}
}

// run runs fn on the worker that waited least, or on a new one.
func (w *workers) run(fn func()) {
	w.mu.Lock()
	if n := len(w.waiting); n > 0 {
		wk := w.waiting[n-1]
		w.waiting[n-1] = nil
		w.waiting = w.waiting[:n-1]
		w.mu.Unlock()
		wk.next <- fn
		return
	}
	w.started++
	w.wg.Add(1)
	w.mu.Unlock()
	go w.loop(&worker{next: make(chan func(), 1)}, fn)
}

// loop runs fn, then the runs handed to wk, until it is done while
// w.max workers wait, or the partition ended.
func (w *workers) loop(wk *worker, fn func()) {
	defer w.wg.Done()
	for {
		fn()
		w.mu.Lock()
		if len(w.waiting) >= w.max || w.ctx.Err() != nil {
			w.mu.Unlock()
			return
		}
		w.waiting = append(w.waiting, wk)
		w.mu.Unlock()
		select {
		case fn = <-wk.next:
			continue
		case <-w.ctx.Done():
		}
		if !w.leave(wk) {
			fn = <-wk.next // taken as the partition ended: its run is on the way
			continue
		}
		return
	}
}

// leave takes wk out of the waiting workers; false when a run took it
// first.
func (w *workers) leave(wk *worker) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, o := range w.waiting {
		if o == wk {
			w.waiting = append(w.waiting[:i], w.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// counts returns the goroutines started so far and the workers waiting.
func (w *workers) counts() (started, waiting int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.started, len(w.waiting)
}

// wait returns once every worker ended (after the partition's context
// ended, and every run returned).
func (w *workers) wait() { w.wg.Wait() }
