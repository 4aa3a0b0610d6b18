package drain_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

func TestBatchReconcileOnTakeoverAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "taken-1", 2)
	// A drainer claims taken-1 and dies holding it.
	claims, err := b.store.Claim(b.ctx, "dead", 10, 50*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	b.appendN(t, "fresh-1", 1)
	b.appendN(t, "failed-1", 1)

	var mu sync.Mutex
	got := map[string][]bool{}
	rec := newRecorder(func(bt drain.Batch) drain.Result {
		mu.Lock()
		defer mu.Unlock()
		got[bt.Stream] = append(got[bt.Stream], bt.Reconcile)
		if bt.Stream == "failed-1" && len(got[bt.Stream]) == 1 {
			return drain.Result{Err: errors.New("publish timed out")}
		}
		return drain.Result{Done: len(bt.Events)}
	})
	d := b.drain(t, rec, drain.Config{Backoff: func(int) time.Duration { return 0 }})
	require.Eventually(t, func() bool { // the dead drainer's lease expires
		st, err := d.Cycle(b.ctx)
		require.NoError(t, err)
		return st.Claimed > 0 && b.info(t, "taken-1").Lag == 0
	}, 10*time.Second, 20*time.Millisecond)
	cycleUntilIdle(t, b.ctx, d)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string][]bool{
		"taken-1":  {true},        // a takeover reconciles
		"fresh-1":  {false},       // a free stream on its first attempt does not
		"failed-1": {false, true}, // the attempt after a failure does
	}, got)
}

func TestUnavailableCountsNoRetryAndNeverBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "out-1", 2)
	var mu sync.Mutex
	var outage, normal []int
	var reconcile []bool
	unavailable := func(bt drain.Batch) drain.Result {
		return drain.Result{Err: drain.Unavailable(errors.New("nats: timeout"))}
	}
	rec := newRecorder(unavailable)
	record := func(h drain.Handler) drain.Handler {
		return drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
			mu.Lock()
			for _, bt := range batches {
				reconcile = append(reconcile, bt.Reconcile)
			}
			mu.Unlock()
			return h.Handle(ctx, batches)
		})
	}
	d := b.drain(t, record(rec), drain.Config{
		MaxRetries: 1,
		Backoff: func(r int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			normal = append(normal, r)
			return 0
		},
		OutageBackoff: func(n int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			outage = append(outage, n)
			return 0
		},
	})
	setVerdict := func(v func(drain.Batch) drain.Result) {
		rec.mu.Lock()
		rec.verdict = v
		rec.mu.Unlock()
	}

	// Four outage attempts, more than MaxRetries allows failures.
	for i := range 4 {
		st, err := d.Cycle(b.ctx)
		require.NoError(t, err)
		require.Equal(t, drain.Stats{Claimed: 1, Retried: 1, Unavailable: 1}, st)
		si := b.info(t, "out-1")
		require.Zero(t, si.Retry, "attempt %d: an outage counts no retry", i+1)
		require.False(t, si.Blocked, "attempt %d: an outage blocks no stream", i+1)
		require.Contains(t, si.Error, "bus unavailable")
	}
	mu.Lock()
	require.Equal(t, []int{0, 1, 2, 3}, outage, "the delay grows with the outage cycles in a row")
	require.Empty(t, normal)
	require.Equal(t, []bool{false, true, true, true}, reconcile,
		"after an outage attempt the next one reconciles: its publishes may have been stored")
	mu.Unlock()

	// A failure of the stream itself still counts toward MaxRetries, and
	// ends the run of outage cycles.
	setVerdict(func(drain.Batch) drain.Result { return drain.Result{Err: errors.New("stream refused")} })
	st, err := d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Retried)
	require.Equal(t, 1, b.info(t, "out-1").Retry)

	// An outage keeps that count as it is, whatever its length; its delay
	// starts again from the beginning.
	setVerdict(unavailable)
	for range 3 {
		st, err = d.Cycle(b.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Unavailable)
		require.Equal(t, 1, b.info(t, "out-1").Retry)
	}
	mu.Lock()
	require.Equal(t, []int{0, 1, 2, 3, 0, 1, 2}, outage)
	require.Equal(t, []int{0}, normal)
	mu.Unlock()

	// The second failure of the stream is one more than MaxRetries: blocked.
	setVerdict(func(drain.Batch) drain.Result { return drain.Result{Err: errors.New("stream refused")} })
	st, err = d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Blocked)
	si := b.info(t, "out-1")
	require.True(t, si.Blocked)
	require.Equal(t, 2, si.Retry)
}

func TestOutageBackoffPacing(t *testing.T) {
	t.Parallel()
	for range 50 {
		require.InDelta(t, float64(5*time.Second), float64(drain.OutageBackoff(0)), 0.2*float64(5*time.Second))
		require.InDelta(t, float64(10*time.Second), float64(drain.OutageBackoff(1)), 0.2*float64(10*time.Second))
		require.InDelta(t, float64(30*time.Second), float64(drain.OutageBackoff(3)), 0.2*float64(30*time.Second))
		require.InDelta(t, float64(30*time.Second), float64(drain.OutageBackoff(500)), 0.2*float64(30*time.Second))
	}
	// The promise in the docs: at most 5 attempts in the first minute, 3 in
	// any later minute, with the shortest jittered delays.
	at, attempts := time.Duration(0), 0
	for r := 0; at < time.Minute; r++ {
		attempts++
		at += time.Duration(float64(min(drain.OutageBackoffBase<<r, drain.OutageBackoffCap)) * (1 - drain.BackoffJitter))
	}
	require.LessOrEqual(t, attempts, 5)
}

// switchHandler fails every batch as unavailable while down is set, and
// counts the batches it was handed.
type switchHandler struct {
	mu      sync.Mutex
	down    bool
	batches int
	done    int
}

func (h *switchHandler) Handle(_ context.Context, batches []drain.Batch) []drain.Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]drain.Result, len(batches))
	for i, bt := range batches {
		h.batches++
		if h.down {
			out[i] = drain.Result{Err: drain.Unavailable(errors.New("nats: no responders available for request"))}
			continue
		}
		h.done += len(bt.Events)
		out[i] = drain.Result{Done: len(bt.Events)}
	}
	return out
}

func (h *switchHandler) set(down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = down
}

func (h *switchHandler) counts() (batches, done int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.batches, h.done
}

func TestRunProbesWithOneStreamDuringAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const streams = 20
	for i := range streams {
		b.appendN(t, "probe-"+string(rune('a'+i)), 1)
	}
	h := &switchHandler{down: true}
	clock := newWaitClock()
	const poll = time.Second
	d := b.drain(t, h, drain.Config{
		PollInterval:  poll,
		OutageBackoff: func(int) time.Duration { return 0 }, // every stream is due again at once
		Clock:         clock,
	})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	// The first cycle tries every stream; after it, the drain pauses
	// (PollInterval doubling up to MaxOutagePause) and probes with one
	// stream at a time.
	for i, pause := range []time.Duration{poll, 2 * poll, 4 * poll, 8 * poll, drain.MaxOutagePause, drain.MaxOutagePause} {
		require.Equal(t, pause, clock.next(t), "pause %d", i)
		n, _ := h.counts()
		require.Equal(t, streams+i, n, "one stream per probe, after each pause")
		clock.Advance(pause)
	}

	// The probe after the last pause gets through: the drain resumes in
	// full, then idles.
	require.Equal(t, drain.MaxOutagePause, clock.next(t))
	h.set(false)
	clock.Advance(drain.MaxOutagePause)
	require.Equal(t, poll, clock.next(t), "idle after the backlog")
	_, n := h.counts()
	require.Equal(t, streams, n, "every stream forwarded once the bus is back")
	cancel()
	require.NoError(t, <-done)
	for i := range streams {
		require.False(t, b.info(t, "probe-"+string(rune('a'+i))).Blocked)
	}
}
