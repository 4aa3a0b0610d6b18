package drain_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

// After a light cycle Run waits Linger before it claims again, so the
// events appended meanwhile, over several streams, go in one cycle; an
// idle Run still waits for a notification or PollInterval.
func TestRunLingersAfterALightCycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var cycles [][]string // the streams of each Handle call
	h := drain.HandlerFunc(func(_ context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		var streams []string
		for i, bt := range batches {
			streams = append(streams, bt.Stream)
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		mu.Lock()
		cycles = append(cycles, streams)
		mu.Unlock()
		return out
	})
	handled := func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return append([][]string(nil), cycles...)
	}
	const linger, poll = 7 * time.Hour, time.Hour
	clock := newWaitClock()
	d := b.drain(t, h, drain.Config{Linger: linger, PollInterval: poll, Clock: clock, Notifier: b.store})
	b.appendN(t, "linger-1", 1)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Equal(t, linger, clock.next(t), "a light cycle lingers")
	require.Equal(t, [][]string{{"linger-1"}}, handled())
	b.appendN(t, "linger-2", 2)
	b.appendN(t, "linger-3", 1)
	require.Len(t, handled(), 1, "nothing claimed while lingering")

	clock.Advance(linger)
	require.Equal(t, linger, clock.next(t), "the next light cycle lingers too")
	got := handled()
	require.Len(t, got, 2)
	require.ElementsMatch(t, []string{"linger-2", "linger-3"}, got[1], "one cycle for what came meanwhile")

	clock.Advance(linger)
	require.Equal(t, poll, clock.next(t), "a cycle that claimed nothing waits as before")
	b.appendN(t, "linger-4", 1)
	require.Eventually(t, func() bool { return len(handled()) == 3 }, 10*time.Second, 5*time.Millisecond,
		"a notification wakes an idle Run at once")
}

func TestNewRejectsNegativeLinger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := drain.New(b.store, newRecorder(nil), drain.Config{Linger: -time.Millisecond})
	require.ErrorIs(t, err, drain.ErrInvalidConfig)
	require.ErrorContains(t, err, "Config.Linger -1ms")
}
