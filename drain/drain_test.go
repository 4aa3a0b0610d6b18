package drain_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

type bundle struct {
	ctx    context.Context
	store  *store.Store
	schema string
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	s, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	return bundle{ctx: t.Context(), store: s, schema: schema}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func (b bundle) drain(t *testing.T, h drain.Handler, cfg drain.Config) *drain.Drain {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	d, err := drain.New(b.store, h, cfg)
	require.NoError(t, err)
	return d
}

func (b bundle) appendN(t *testing.T, stream string, n int) []event.Event {
	t.Helper()
	evs := make([]store.NewEvent, n)
	for i := range evs {
		evs[i] = store.NewEvent{Name: "Happened", Data: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	out, err := b.store.Append(b.ctx, stream, store.AnyVersion, evs...)
	require.NoError(t, err)
	return out
}

func (b bundle) info(t *testing.T, stream string) store.StreamInfo {
	t.Helper()
	infos, err := b.store.Streams(b.ctx, store.StreamFilter{Match: "^" + stream + "$"})
	require.NoError(t, err)
	require.Len(t, infos, 1)
	return infos[0]
}

// recorder is a Handler that records every event it is handed and answers
// with verdict (nil: the whole batch is done).
type recorder struct {
	mu      sync.Mutex
	seen    map[string][]int64 // stream → versions, in the order handled
	ids     []int64
	verdict func(b drain.Batch) drain.Result
}

func newRecorder(verdict func(b drain.Batch) drain.Result) *recorder {
	return &recorder{seen: map[string][]int64{}, verdict: verdict}
}

func (r *recorder) Handle(_ context.Context, batches []drain.Batch) []drain.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]drain.Result, len(batches))
	for i, b := range batches {
		res := drain.Result{Done: len(b.Events)}
		if r.verdict != nil {
			res = r.verdict(b)
		}
		for _, e := range b.Events[:res.Done] {
			r.seen[b.Stream] = append(r.seen[b.Stream], e.Version)
			r.ids = append(r.ids, e.ID)
		}
		out[i] = res
	}
	return out
}

func (r *recorder) versions(stream string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.seen[stream]...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// cycleUntilIdle runs cycles until one claims nothing.
func cycleUntilIdle(t *testing.T, ctx context.Context, d *drain.Drain) drain.Stats {
	t.Helper()
	var total drain.Stats
	for range 100 {
		st, err := d.Cycle(ctx)
		require.NoError(t, err)
		if st.Claimed == 0 {
			return total
		}
		total.Claimed += st.Claimed
		total.Forwarded += st.Forwarded
		total.Acked += st.Acked
		total.Retried += st.Retried
		total.Blocked += st.Blocked
	}
	t.Fatal("drain never went idle")
	return total
}

func seq(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i)
	}
	return out
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newRecorder(nil)
	cases := []struct {
		cfg  drain.Config
		want string
	}{
		{drain.Config{Lease: -time.Second}, "Lease -1s"},
		{drain.Config{Lease: time.Microsecond}, "Lease 1µs"},
		{drain.Config{ClaimLimit: -1}, "ClaimLimit -1"},
		{drain.Config{FetchLimit: -5}, "FetchLimit -5"},
		{drain.Config{PollInterval: -time.Millisecond}, "PollInterval -1ms"},
		{drain.Config{MaxRetries: -2}, "MaxRetries -2"},
	}
	for _, c := range cases {
		_, err := drain.New(b.store, h, c.cfg)
		require.ErrorIs(t, err, drain.ErrInvalidConfig)
		require.ErrorContains(t, err, c.want)
	}
	_, err := drain.New(b.store, nil, drain.Config{})
	require.ErrorContains(t, err, "handler is nil")
	d, err := drain.New(b.store, h, drain.Config{})
	require.NoError(t, err)
	require.NotEmpty(t, d.Owner())
}

func TestExponentialBackoff(t *testing.T) {
	t.Parallel()
	for range 50 {
		require.InDelta(t, float64(time.Second), float64(drain.ExponentialBackoff(0)), 0.2*float64(time.Second))
		require.InDelta(t, float64(8*time.Second), float64(drain.ExponentialBackoff(3)), 0.2*float64(8*time.Second))
		require.InDelta(t, float64(5*time.Minute), float64(drain.ExponentialBackoff(12)), 0.2*float64(5*time.Minute))
		require.InDelta(t, float64(5*time.Minute), float64(drain.ExponentialBackoff(1000)), 0.2*float64(5*time.Minute))
	}
}

func TestEventsFlowInStreamOrderAndWatermarksAdvance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Interleave appends so ids of different streams mix.
	for range 4 {
		b.appendN(t, "order-1", 2)
		b.appendN(t, "order-2", 1)
		b.appendN(t, "payment-1", 3)
	}
	rec := newRecorder(nil)
	d := b.drain(t, rec, drain.Config{FetchLimit: 3, ClaimLimit: 2})

	st := cycleUntilIdle(t, b.ctx, d)
	require.Equal(t, 24, st.Forwarded)
	require.Zero(t, st.Retried+st.Blocked)
	for stream, n := range map[string]int{"order-1": 8, "order-2": 4, "payment-1": 12} {
		require.Equal(t, seq(n), rec.versions(stream), stream)
		si := b.info(t, stream)
		require.Equal(t, int64(n-1), si.Watermark, stream)
		require.Zero(t, si.Lag)
		require.Empty(t, si.LeasedBy)
	}
	appended, forwarded, err := b.store.Totals(b.ctx)
	require.NoError(t, err)
	require.Equal(t, appended, forwarded)

	// New events continue from the watermark, without repeats.
	b.appendN(t, "order-2", 2)
	cycleUntilIdle(t, b.ctx, d)
	require.Equal(t, seq(6), rec.versions("order-2"))
}

func TestHandlerErrorRetriesWithBackoffThenBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := b.appendN(t, "bad-1", 2)
	b.appendN(t, "good-1", 1)
	rec := newRecorder(func(batch drain.Batch) drain.Result {
		if batch.Stream == "bad-1" {
			return drain.Result{Err: errors.New("receiver says no")}
		}
		return drain.Result{Done: len(batch.Events)}
	})
	// The first backoff is long enough that the checks before it ends
	// hold on a loaded machine (300 ms did not under make test); the
	// later ones are short, so the test waits little for them.
	const firstBackoff, backoff = 2 * time.Second, 300 * time.Millisecond
	var mu sync.Mutex
	var asked []int
	d := b.drain(t, rec, drain.Config{MaxRetries: 2, Backoff: func(retry int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, retry)
		if retry == 0 {
			return firstBackoff
		}
		return backoff
	}})

	st, err := d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, drain.Stats{Claimed: 2, Forwarded: 1, Acked: 1, Retried: 1}, st)
	si := b.info(t, "bad-1")
	require.Equal(t, 1, si.Retry)
	require.True(t, si.NextAttempt.After(time.Now()), "next attempt in the future")
	require.Contains(t, si.Error, fmt.Sprintf("event %d", bad[0].ID))
	require.Contains(t, si.Error, "receiver says no")

	st, err = d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Claimed, "not claimed before its next attempt")

	// Second failure: retry 1 → 2 (still within MaxRetries).
	waitCycle := func() drain.Stats {
		var st drain.Stats
		require.Eventually(t, func() bool {
			var err error
			st, err = d.Cycle(b.ctx)
			require.NoError(t, err)
			return st.Claimed > 0
		}, 10*time.Second, 20*time.Millisecond)
		return st
	}
	require.Equal(t, 1, waitCycle().Retried)
	require.Equal(t, 2, b.info(t, "bad-1").Retry)

	// Third failure would make retry 3 > MaxRetries 2: blocked.
	require.Equal(t, 1, waitCycle().Blocked)
	si = b.info(t, "bad-1")
	require.True(t, si.Blocked)
	require.Contains(t, si.Error, "after 3 attempts")
	require.Equal(t, int64(-1), si.Watermark)
	mu.Lock()
	require.Equal(t, []int{0, 1}, asked, "backoff asked with the retry count")
	mu.Unlock()

	// Other streams go on; the blocked one stays out.
	b.appendN(t, "good-1", 2)
	b.appendN(t, "bad-1", 1)
	time.Sleep(backoff)
	cycleUntilIdle(t, b.ctx, d)
	require.Equal(t, seq(3), rec.versions("good-1"))
	require.Empty(t, rec.versions("bad-1"))
	require.True(t, b.info(t, "bad-1").Blocked)
}

func TestNonRetryableErrorBlocksAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "poison-1", 3)
	rec := newRecorder(func(batch drain.Batch) drain.Result {
		return drain.Result{Done: 1, Err: drain.NonRetryable(errors.New("too large for the bus"))}
	})
	d := b.drain(t, rec, drain.Config{Backoff: func(int) time.Duration { return 0 }})

	st, err := d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, drain.Stats{Claimed: 1, Forwarded: 1, Blocked: 1}, st)
	si := b.info(t, "poison-1")
	require.True(t, si.Blocked)
	require.Equal(t, int64(0), si.Watermark, "the event before the poison one counts")
	require.Contains(t, si.Error, fmt.Sprintf("event %d", evs[1].ID))
	require.Contains(t, si.Error, "too large for the bus")

	st, err = d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Zero(t, st.Claimed)
}

func TestPartialProgressAdvancesWatermark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := b.appendN(t, "part-1", 5)
	var mu sync.Mutex
	calls := 0
	rec := newRecorder(func(batch drain.Batch) drain.Result {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return drain.Result{Done: 2, Err: errors.New("publish timed out")}
		}
		return drain.Result{Done: len(batch.Events)}
	})
	d := b.drain(t, rec, drain.Config{Backoff: func(int) time.Duration { return 0 }})

	st, err := d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, drain.Stats{Claimed: 1, Forwarded: 2, Retried: 1}, st)
	si := b.info(t, "part-1")
	require.Equal(t, evs[1].Version, si.Watermark)
	require.Equal(t, 1, si.Retry)
	require.Contains(t, si.Error, fmt.Sprintf("event %d", evs[2].ID))

	cycleUntilIdle(t, b.ctx, d)
	require.Equal(t, seq(5), rec.versions("part-1"), "resumes after the partial progress, no repeats")
	si = b.info(t, "part-1")
	require.Equal(t, int64(4), si.Watermark)
	require.Zero(t, si.Retry)
	require.Empty(t, si.Error)
}

func TestRunWakesOnNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder(nil)
	d := b.drain(t, rec, drain.Config{PollInterval: time.Hour, Notifier: b.store})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	b.appendN(t, "wake-1", 1)
	require.Eventually(t, func() bool { return rec.count() == 1 }, 10*time.Second, 5*time.Millisecond)
	// Run is now idle with an hour to the next poll: only a notification can
	// get the next event through.
	b.appendN(t, "wake-1", 1)
	require.Eventually(t, func() bool { return rec.count() == 2 }, 10*time.Second, 5*time.Millisecond)

	cancel()
	require.NoError(t, <-done)
}

func TestRunStopsOnCancelAndReleasesLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "held-1", 2)
	started := make(chan struct{})
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		close(started)
		<-ctx.Done() // a publish stuck until shutdown
		out := make([]drain.Result, len(batches))
		for i := range out {
			out[i] = drain.Result{Err: ctx.Err()}
		}
		return out
	})
	clock := newWaitClock()
	const grace = 5 * time.Second
	d := b.drain(t, h, drain.Config{Owner: "first", Lease: time.Hour, PollInterval: time.Hour, ShutdownGrace: grace, Clock: clock})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-started
	cancel()
	require.Equal(t, grace, clock.next(t), "the stuck batch gets ShutdownGrace")
	clock.Advance(grace)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the grace")
	}

	claims, err := b.store.Claim(b.ctx, "second", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1, "the lease was released, not left to expire")
	require.Equal(t, "held-1", claims[0].Stream)
	require.Zero(t, claims[0].Retry, "shutdown does not count a retry")
	require.Equal(t, int64(-1), claims[0].Watermark)
}

// shutdownMidClaim is the store with a shutdown that lands while a claim
// is in flight: the claim commits in Postgres, then the run's context ends
// before the answer is read, as a cancelled query whose commit won the race
// would. If the drain had claimed with the run's context, it would lose
// the answer and the leases would outlive Run.
type shutdownMidClaim struct {
	drain.Store
	stop func()
}

func (s shutdownMidClaim) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]event.Claim, error) {
	claims, err := s.Store.Claim(ctx, owner, limit, lease)
	s.stop()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return claims, err
}

func TestRunReleasesStreamsClaimedAsShutdownBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "late-1", 2)
	ctx, cancel := context.WithCancel(b.ctx)
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		for i := range out {
			out[i] = drain.Result{Err: context.Canceled}
		}
		return out
	})
	d, err := drain.New(shutdownMidClaim{Store: b.store, stop: cancel}, h,
		drain.Config{Owner: "first", Lease: time.Hour, PollInterval: time.Hour, ShutdownGrace: 50 * time.Millisecond, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, d.Run(ctx))

	claims, err := b.store.Claim(b.ctx, "second", 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claims, 1, "the stream claimed as shutdown began was given back, not left leased for an hour")
	require.Equal(t, "late-1", claims[0].Stream)
	require.Zero(t, claims[0].Retry)
}

func TestRunFinishesTheBatchInFlightOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "busy-1", 3)
	started := make(chan context.Context, 1)
	proceed := make(chan struct{})
	h := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		started <- ctx
		<-proceed // publishing, while shutdown begins
		out := make([]drain.Result, len(batches))
		for i, bt := range batches {
			out[i] = drain.Result{Done: len(bt.Events)}
		}
		return out
	})
	clock := newWaitClock()
	d := b.drain(t, h, drain.Config{Owner: "first", Lease: time.Minute, PollInterval: time.Hour, Clock: clock})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	hctx := <-started
	cancel()
	require.Equal(t, drain.DefaultShutdownGrace, clock.next(t), "the batch in flight gets ShutdownGrace")
	clock.Advance(drain.DefaultShutdownGrace - time.Millisecond)
	require.NoError(t, hctx.Err(), "the handler's context lasts the shutdown grace")
	close(proceed)
	require.NoError(t, <-done)

	infos, err := b.store.Streams(b.ctx, store.StreamFilter{})
	require.NoError(t, err)
	require.Len(t, infos, 1)
	require.Equal(t, int64(2), infos[0].Watermark, "the batch finished during shutdown is acked")
	require.Empty(t, infos[0].LeasedBy)
}

func TestRunSurvivesStoreErrors(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	s, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	rec := newRecorder(nil)
	clock := newWaitClock()
	const poll = 10 * time.Millisecond
	// Not migrated yet: every claim fails, as when the database is away.
	d, err := drain.New(s, rec, drain.Config{PollInterval: poll, Logger: quiet(), Clock: clock})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	// Run pauses after each failed cycle, the pause doubling, instead of
	// returning.
	for _, pause := range []time.Duration{poll, 2 * poll, 4 * poll} {
		require.Equal(t, pause, clock.next(t))
		clock.Advance(pause)
	}
	require.Equal(t, 8*poll, clock.next(t))
	select {
	case err := <-done:
		t.Fatalf("Run exited on a store error: %v", err)
	default:
	}
	require.NoError(t, s.Migrate(t.Context()))
	_, err = s.Append(t.Context(), "late-1", store.NoStream, store.NewEvent{Name: "E", Data: []byte(`{}`)})
	require.NoError(t, err)
	clock.Advance(8 * poll)
	require.Equal(t, poll, clock.next(t), "idle again, at PollInterval, once the store answers")
	require.Equal(t, 1, rec.count())

	cancel()
	require.NoError(t, <-done)
}
