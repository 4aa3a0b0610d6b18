package breaker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
)

// memStore is a Store in memory that tells every Set sharing it of each
// change, as the consumer's watch on its key-value bucket does.
type memStore struct {
	mu   sync.Mutex
	st   map[string]breaker.SharedState
	rev  map[string]uint64
	seq  uint64
	sets []*breaker.Set
}

func newMemStore() *memStore {
	return &memStore{st: map[string]breaker.SharedState{}, rev: map[string]uint64{}}
}

func (m *memStore) Load(_ context.Context, endpoint string) (breaker.SharedState, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st[endpoint], m.rev[endpoint], nil
}

func (m *memStore) Swap(_ context.Context, st breaker.SharedState, rev uint64) (uint64, error) {
	m.mu.Lock()
	if m.rev[st.Endpoint] != rev {
		m.mu.Unlock()
		return 0, fmt.Errorf("%w: have %d", breaker.ErrConflict, m.rev[st.Endpoint])
	}
	m.seq++
	m.st[st.Endpoint], m.rev[st.Endpoint] = st, m.seq
	n, sets := m.seq, append([]*breaker.Set(nil), m.sets...)
	m.mu.Unlock()
	for _, s := range sets {
		s.Observe(st, n)
	}
	return n, nil
}

// Three processes share an endpoint's breaker: the first to trip opens it
// for all; after the open timeout exactly one probes while the others
// wait; its success lets all through at once.
func TestSharedBreakerOneProbe(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	const endpoint = "http://x/hook"
	var bs []*breaker.Breaker
	// The probe's claim lasts an open timeout: 3 s, long beside the check
	// below (300 ms of no second probe), so that it fails only for a
	// second claim, not for a goroutine stalled past the claim's end. A
	// real second claim was possible: see
	// TestClaimAfterAnotherProcessClaimedIsRefused.
	const openTimeout = 3 * time.Second
	for i := range 3 {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: openTimeout}, nil, nil)
		require.NoError(t, err)
		set.Share(store, fmt.Sprintf("replica-%d", i))
		store.sets = append(store.sets, set)
		bs = append(bs, set.Breaker(endpoint))
	}
	for range 2 {
		require.ErrorIs(t, bs[0].Execute(fail), errDown)
	}
	require.Eventually(t, func() bool {
		return bs[1].State() == breaker.Open && bs[2].State() == breaker.Open
	}, 10*time.Second, time.Millisecond, "one process tripped: open for all")
	require.ErrorIs(t, bs[1].Execute(succeed), breaker.ErrOpen, "open: nothing runs")

	ctx, cancel := context.WithTimeout(context.Background(), 3*openTimeout)
	defer cancel()
	var passed atomic.Int32
	var wg sync.WaitGroup
	first := make(chan int, 3)
	for i, b := range bs {
		wg.Go(func() {
			if b.Wait(ctx) == nil {
				passed.Add(1)
				first <- i
			}
		})
	}
	prober := <-first
	require.Never(t, func() bool { return passed.Load() > 1 }, 300*time.Millisecond, 10*time.Millisecond, "one probe per open timeout")
	for i, b := range bs {
		if i != prober {
			require.ErrorIs(t, b.Execute(succeed), breaker.ErrOpen, "replica %d does not probe", i)
		}
	}
	require.NoError(t, bs[prober].Execute(succeed))
	wg.Wait()
	require.EqualValues(t, 3, passed.Load(), "all through once the probe closed it")
	for i, b := range bs {
		require.Equal(t, breaker.Closed, b.State(), "replica %d closed with the probe", i)
	}
}

// failStore is a Store that cannot be reached.
type failStore struct{}

func (failStore) Load(context.Context, string) (breaker.SharedState, uint64, error) {
	return breaker.SharedState{}, 0, errDown
}

func (failStore) Swap(context.Context, breaker.SharedState, uint64) (uint64, error) {
	return 0, errDown
}

// A store that cannot be reached leaves each process its local breaker,
// logged once.
func TestSharedBreakerStoreDownIsLocal(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: readableOpenTimeout}, log, nil)
	require.NoError(t, err)
	set.Share(failStore{}, "replica-0")
	b := set.Breaker("http://x/hook")
	require.ErrorIs(t, b.Execute(fail), errDown)
	require.Equal(t, breaker.Open, b.State(), "the local breaker opened")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.Wait(ctx))
	require.NoError(t, b.Execute(succeed), "the local probe goes through")
	require.Equal(t, breaker.Closed, b.State())
	require.ErrorIs(t, b.Execute(fail), errDown)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(logs.String(), "shared circuit breaker state not available") == 1
	}, 10*time.Second, 5*time.Millisecond, "logged once")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestSharedProbeTransitionsAreExported(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	reg := prometheus.NewRegistry()
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 200 * time.Millisecond}, nil, reg)
	require.NoError(t, err)
	set.Share(store, "replica-0")
	store.sets = append(store.sets, set)
	const endpoint = "http://x/hook"
	b := set.Breaker(endpoint)
	require.ErrorIs(t, b.Execute(fail), errDown)
	trans := func(from, to string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "jsbridge_consumer_breaker_transitions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["endpoint"] == endpoint && l["from"] == from && l["to"] == to {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.Wait(ctx))
	require.ErrorIs(t, b.Execute(fail), errDown, "the probe fails")
	require.Equal(t, 1.0, trans("half-open", "open"), "a failed shared probe is exported as the local breaker's would be")
	require.NoError(t, b.Wait(ctx))
	require.NoError(t, b.Execute(succeed))
	require.Equal(t, 1.0, trans("half-open", "closed"))
}
