package integration

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// retrySampler polls the streams table while a test runs and keeps the
// highest retry count and the most streams with a retry or blocked seen.
type retrySampler struct {
	maxRetry, maxRetried, maxBlocked atomic.Int64
	samples                          atomic.Int64
}

func (s *retrySampler) run(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string) {
	for ctx.Err() == nil {
		var maxRetry, retried, blocked int64
		err := pool.QueryRow(ctx, "SELECT coalesce(max(retry), 0), count(*) FILTER (WHERE retry > 0), count(*) FILTER (WHERE blocked) FROM "+
			schema+".streams").Scan(&maxRetry, &retried, &blocked)
		if err == nil {
			s.samples.Add(1)
			for _, p := range []struct {
				max *atomic.Int64
				v   int64
			}{{&s.maxRetry, maxRetry}, {&s.maxRetried, retried}, {&s.maxBlocked, blocked}} {
				if p.v > p.max.Load() {
					p.max.Store(p.v)
				}
			}
		} else if ctx.Err() == nil {
			t.Logf("sample streams: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// failureCounter counts the batches a handler failed, and those that
// failed because the bus was unavailable, and keeps the first few other
// failures for the test's log.
type failureCounter struct {
	failed, unavailable atomic.Int64
	mu                  sync.Mutex
	other               []string // "stream: error" of failures not unavailable, at most 5
}

// others returns the failures kept that were not unavailable.
func (c *failureCounter) others() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.other)
}

func (c *failureCounter) wrap(h drain.Handler) drain.Handler {
	return drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		res := h.Handle(ctx, batches)
		for i, r := range res {
			if r.Err != nil {
				c.failed.Add(1)
				if drain.IsUnavailable(r.Err) {
					c.unavailable.Add(1)
					continue
				}
				c.mu.Lock()
				if len(c.other) < 5 {
					c.other = append(c.other, fmt.Sprintf("%s: %v", batches[i].Stream, r.Err))
				}
				c.mu.Unlock()
			}
		}
		return res
	})
}

// JetStream frozen: the nats-server process is stopped with SIGSTOP (its
// sockets stay open, nothing is answered) for twice the lease while a
// bridge drains 500 streams that are still being appended to, then
// continued. Publishes and lookups time out or are cut by the cycle's
// deadline; all of it is an outage, not the streams' fault: no stream's
// retry count moves at any time (the streams table is sampled all along),
// none is blocked, and afterwards every stream drains completely, every
// event stored once and in order. Once with the publish timeout the
// bridge uses (fitted to the lease), once with one longer than the cycle's
// deadline, so the deadline, not the timer, cuts the publishes.
func TestBridgeJetStreamFrozenPastTheLease(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	fitted, lowered := bridge.FitPublishTimeout(bridge.DefaultPublishTimeout, lease)
	require.True(t, lowered)
	for _, c := range []struct {
		name           string
		publishTimeout time.Duration
	}{
		{"fitted publish timeout", fitted},
		{"publish timeout past the cycle's deadline", forward.DefaultPublishTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			frozenPastTheLease(t, lease, c.publishTimeout)
		})
	}
}

func frozenPastTheLease(t *testing.T, lease, publishTimeout time.Duration) {
	srv := startNATSProc(t)
	pool := jsbridgetest.Pool(t)
	schema := jsbridgetest.Schema(t, pool)
	st, err := store.New(pool, store.WithSchema(schema))
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))

	nc, err := nats.Connect(srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = forward.Provision(t.Context(), js, forward.StreamConfig{})
	require.NoError(t, err)

	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fwd, err := forward.New(js, forward.Config{Stream: wire.DefaultEventsStream, PublishTimeout: publishTimeout, Logger: log})
	require.NoError(t, err)
	failures := &failureCounter{}
	d, err := drain.New(st, failures.wrap(fwd), drain.Config{
		Owner: "frozen", Lease: lease, PollInterval: 100 * time.Millisecond, Notifier: st, Logger: log,
		// Shorter than the default (5 s doubling to 30 s) so the test ends
		// soon after the thaw; the retry count does not depend on it.
		OutageBackoff: func(n int) time.Duration { return min(250*time.Millisecond<<min(n, 8), 2*time.Second) },
	})
	require.NoError(t, err)

	const streams = 500
	round := 0
	for ; round < 3; round++ {
		appendRound(t, pool, schema, streams, round)
	}
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampler := &retrySampler{}
	var sampling sync.WaitGroup
	sampling.Go(func() { sampler.run(sampleCtx, t, pool, schema) })
	t.Cleanup(func() { stopSampling(); sampling.Wait() })
	runUntilCleanup(t, d.Run)

	forwarded := func() (appended, fwd int64) {
		a, f, err := st.Totals(context.Background())
		require.NoError(t, err)
		return a, f
	}
	require.Eventually(t, func() bool { _, f := forwarded(); return f >= streams }, 30*time.Second, 20*time.Millisecond, "draining before the freeze")

	// The application goes on appending through the freeze.
	var stop atomic.Bool
	produced := make(chan int, 1)
	go func() {
		r := round
		for ; !stop.Load(); r++ {
			appendRound(t, pool, schema, streams, r)
			time.Sleep(250 * time.Millisecond)
		}
		produced <- r
	}()

	srv.freeze()
	frozenAt := time.Now()
	time.Sleep(2 * lease)
	srv.thaw()
	_, atThaw := forwarded()
	t.Logf("frozen for %s; %d events forwarded at the thaw", time.Since(frozenAt).Round(time.Millisecond), atThaw)
	time.Sleep(time.Second) // appends go on after the thaw
	stop.Store(true)
	rounds := <-produced

	drained := assertEventually(t, func() bool { a, f := forwarded(); return a == f }, 45*time.Second)
	stopSampling()
	sampling.Wait()
	appended, fwdTotal := forwarded()
	t.Logf("after the thaw: %d of %d events forwarded; failed batches %d (unavailable %d); sampled %d times: highest retry %d, most streams with retry > 0 at once %d, most blocked %d",
		fwdTotal, appended, failures.failed.Load(), failures.unavailable.Load(), sampler.samples.Load(),
		sampler.maxRetry.Load(), sampler.maxRetried.Load(), sampler.maxBlocked.Load())
	rows, err := st.Streams(context.Background(), store.StreamFilter{})
	require.NoError(t, err)
	var retried, blocked []string
	for _, si := range rows {
		if si.Retry > 0 {
			retried = append(retried, fmt.Sprintf("%s retry %d (%s)", si.Stream, si.Retry, si.Error))
		}
		if si.Blocked {
			blocked = append(blocked, si.Stream)
		}
	}
	for _, o := range failures.others() {
		t.Logf("a failure not counted as an outage: %s", o)
	}
	t.Logf("at the end: %d streams with retry > 0, %d blocked", len(retried), len(blocked))
	if len(retried) > 0 {
		t.Logf("first: %s", retried[0])
	}

	require.True(t, drained, "every stream drained after the thaw")
	require.Positive(t, failures.unavailable.Load(), "the freeze was felt")
	require.Empty(t, blocked, "no stream blocked")
	require.Empty(t, retried, "no stream's retry count grew")
	require.Zero(t, sampler.maxRetry.Load(), "no stream's retry count grew at any time during the run")
	require.Zero(t, sampler.maxBlocked.Load())
	heads := map[string]int64{}
	for s := range streams {
		heads[fmt.Sprintf("order-%d", s)] = int64(rounds - 1)
	}
	requireExactlyOnceInOrder(t, js, heads)
}
