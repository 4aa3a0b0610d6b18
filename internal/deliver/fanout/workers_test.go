package fanout

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
)

// A run started while a worker waits goes to that worker, not to a new
// goroutine; a worker done while as many as the bound wait ends, and so
// do the waiting ones once the partition ended.
func TestARunGoesToAWaitingWorkerUpToTheBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	w := newWorkers(ctx, 2)
	waiting := func(n int) func() bool {
		return func() bool { _, w := w.counts(); return w == n }
	}
	done := make(chan int, 8)
	w.run(func() { done <- 1 })
	require.Equal(t, 1, <-done)
	eventually(t, waiting(1), "the worker waits for the next run")
	w.run(func() { done <- 2 })
	require.Equal(t, 2, <-done)
	started, _ := w.counts()
	require.Equal(t, 1, started, "the second run went to the waiting worker")
	eventually(t, waiting(1), "the worker waits again")

	// Three runs at once: the waiting worker takes one, two new ones the
	// others; as they finish, two wait and the third ends.
	release := make(chan struct{})
	for i := range 3 {
		w.run(func() { <-release; done <- 3 + i })
	}
	started, _ = w.counts()
	require.Equal(t, 3, started)
	close(release)
	for range 3 {
		<-done
	}
	eventually(t, waiting(2), "two wait, the bound")
	cancel()
	w.wait() // the third ended as it finished, the partition's end the others
	require.True(t, waiting(0)())
}

// A partition's unordered sends, one after the other, all run on the
// worker that ran the first: none starts a goroutine (and grows its
// stack) of its own. Close ends the waiting worker.
func TestAPartitionsSendsReuseItsWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pos, _ := b.claim(t, "replica-a", 1)
	rec := newRecorder(nil)
	f := New(Config{Archetype: base.New(b.clock, nil, "")}, members(t, member.Member{Name: "u", Filters: []string{"events.>"}, MaxInFlight: 4}), pos, rec, nil, nil)
	for i, e := range events(1, 5, 5) {
		f.Dispatch(e)
		eventually(t, func() bool { _, w := f.workers.counts(); return len(rec.seqs("u")) == i+1 && w == 1 }, "the send settled and its worker waits")
	}
	started, _ := f.workers.counts()
	require.Equal(t, 1, started, "one worker ran the five sends")
	f.Close()
	_, waiting := f.workers.counts()
	require.Zero(t, waiting, "Close ended the waiting worker")
}
