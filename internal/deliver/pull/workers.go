package pull

import (
	"sync"
	"time"
)

// Workers runs functions on reused goroutines. A delivery's call path (HTTP
// client, signing) is deep: on a fresh goroutine per delivery the stack grows
// and is copied every time (runtime.newstack was ~7 % of the consumer's CPU
// at full speed). Workers follow the number of functions running at once
// (bounded by the caller's slots); one idle for 10 s exits. The zero
// value is ready to use; a Workers must not be copied after first use.
type Workers struct {
	ch   chan func()
	once sync.Once
}

// workerIdle is how long an idle worker waits for a function before it
// exits.
const workerIdle = 10 * time.Second

// Run runs f on an idle worker, or on a new one when none is idle.
func (w *Workers) Run(f func()) {
	w.once.Do(func() { w.ch = make(chan func()) })
	select {
	case w.ch <- f:
	default:
		go w.loop(f)
	}
}

func (w *Workers) loop(f func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		f()
		t.Reset(workerIdle)
		select {
		case f = <-w.ch:
		case <-t.C:
			return
		}
	}
}
