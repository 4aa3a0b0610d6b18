package breaker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
)

var errDown = errors.New("endpoint down")

type bundle struct {
	set *breaker.Set
	reg *prometheus.Registry
}

func setup(t *testing.T, s breaker.Settings) bundle {
	t.Helper()
	reg := prometheus.NewRegistry()
	set, err := breaker.NewSet(s, nil, reg)
	require.NoError(t, err)
	return bundle{set: set, reg: reg}
}

func fail() error    { return errDown }
func succeed() error { return nil }

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 3, OpenTimeout: time.Hour}).set.Breaker("http://x/hook")

	for range 2 {
		require.ErrorIs(t, b.Execute(fail), errDown)
	}
	require.Equal(t, breaker.Closed, b.State())
	require.NoError(t, b.Execute(succeed)) // resets the run
	for range 2 {
		require.ErrorIs(t, b.Execute(fail), errDown)
	}
	require.Equal(t, breaker.Closed, b.State())
	require.ErrorIs(t, b.Execute(fail), errDown)
	require.Equal(t, breaker.Open, b.State())
	require.False(t, b.Ready())

	ran := false
	err := b.Execute(func() error { ran = true; return nil })
	require.ErrorIs(t, err, breaker.ErrOpen)
	require.False(t, ran, "an open breaker must not run the call")
}

// readableOpenTimeout is the open timeout of the tests that read State
// right after a trip: gobreaker reads the wall clock (no clock to
// inject), so a read descheduled past a short timeout (50 ms once; a
// loaded machine under -race) saw half-open where open was right.
const readableOpenTimeout = time.Second

func TestHalfOpenProbeSuccessCloses(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: readableOpenTimeout}).set.Breaker("http://x/hook")
	require.Error(t, b.Execute(fail))
	require.Equal(t, breaker.Open, b.State())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, b.Wait(ctx))
	require.GreaterOrEqual(t, time.Since(start), readableOpenTimeout-100*time.Millisecond)
	require.Equal(t, breaker.HalfOpen, b.State())
	require.True(t, b.Ready())

	// One probe at a time: a second call while the probe runs is rejected.
	inProbe := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- b.Execute(func() error { close(inProbe); <-release; return nil })
	}()
	<-inProbe
	require.ErrorIs(t, b.Execute(succeed), breaker.ErrOpen)
	waitCtx, waitCancel := context.WithTimeout(ctx, 100*time.Millisecond)
	require.ErrorIs(t, b.Wait(waitCtx), context.DeadlineExceeded, "Wait must block while the probe is taken")
	waitCancel()
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, breaker.Closed, b.State())
}

func TestHalfOpenProbeFailureReopens(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: readableOpenTimeout}).set.Breaker("http://x/hook")
	require.Error(t, b.Execute(fail))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.Wait(ctx))
	require.ErrorIs(t, b.Execute(fail), errDown)
	require.Equal(t, breaker.Open, b.State())
	require.False(t, b.Ready())
}

func TestCancelledCallIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Hour}).set.Breaker("http://x/hook")
	require.ErrorIs(t, b.Execute(func() error { return context.Canceled }), context.Canceled)
	require.Equal(t, breaker.Closed, b.State())
}

func TestFailureRatioTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10, OpenTimeout: time.Hour}).set.Breaker("http://x/hook")
	// Alternate: never two failures in a row, ratio 0.5 from the start.
	for i := range 9 {
		if i%2 == 0 {
			require.NoError(t, b.Execute(succeed))
		} else {
			require.Error(t, b.Execute(fail))
		}
		require.Equal(t, breaker.Closed, b.State(), "below MinRequests after %d calls", i+1)
	}
	// Call 10: 5 failures of 10 requests reaches the ratio.
	require.Error(t, b.Execute(fail))
	require.Equal(t, breaker.Open, b.State())
}

func TestFailureRatioBelowThresholdStaysClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, breaker.Settings{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10, OpenTimeout: time.Hour}).set.Breaker("http://x/hook")
	for i := range 30 {
		if i%3 == 0 {
			require.Error(t, b.Execute(fail))
		} else {
			require.NoError(t, b.Execute(succeed))
		}
	}
	require.Equal(t, breaker.Closed, b.State())
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	bb := setup(t, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 50 * time.Millisecond})
	b := bb.set.Breaker("https://user:secret@example.com:8443/hook?token=abc")
	require.Equal(t, "https://example.com:8443/hook", b.Endpoint())

	gauge := func(v breaker.State) string {
		return fmt.Sprintf(`
# HELP jsbridge_consumer_breaker_state Circuit breaker state per webhook endpoint: 0 closed, 1 half-open, 2 open.
# TYPE jsbridge_consumer_breaker_state gauge
jsbridge_consumer_breaker_state{endpoint="https://example.com:8443/hook"} %d
`, int(v))
	}
	requireState := func(v breaker.State) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(bb.reg, strings.NewReader(gauge(v)), "jsbridge_consumer_breaker_state"))
	}
	requireState(breaker.Closed)
	require.Error(t, b.Execute(fail))
	requireState(breaker.Open)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.Wait(ctx))
	requireState(breaker.HalfOpen)
	require.NoError(t, b.Execute(succeed))
	requireState(breaker.Closed)

	expected := `
# HELP jsbridge_consumer_breaker_transitions_total Circuit breaker state transitions per webhook endpoint.
# TYPE jsbridge_consumer_breaker_transitions_total counter
jsbridge_consumer_breaker_transitions_total{endpoint="https://example.com:8443/hook",from="closed",to="open"} 1
jsbridge_consumer_breaker_transitions_total{endpoint="https://example.com:8443/hook",from="half-open",to="closed"} 1
jsbridge_consumer_breaker_transitions_total{endpoint="https://example.com:8443/hook",from="open",to="half-open"} 1
`
	require.NoError(t, testutil.GatherAndCompare(bb.reg, strings.NewReader(expected), "jsbridge_consumer_breaker_transitions_total"))
}

func TestSetsShareRegisteredMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s1, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Hour}, nil, reg)
	require.NoError(t, err)
	s2, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Hour}, nil, reg)
	require.NoError(t, err)
	require.Error(t, s1.Breaker("http://a/").Execute(fail))
	require.Error(t, s2.Breaker("http://b/").Execute(fail))
	n, err := testutil.GatherAndCount(reg, "jsbridge_consumer_breaker_transitions_total")
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://u:p@h.example:8443/a/b?sig=1#f": "https://h.example:8443/a/b",
		"http://h.example":                       "http://h.example",
		"http://[::1]:80/x":                      "http://[::1]:80/x",
		"http://h.example/%zz":                   "invalid-url",
	} {
		require.Equal(t, want, breaker.Endpoint(in), in)
	}
}

func TestBreakerPerEndpoint(t *testing.T) {
	t.Parallel()
	set := setup(t, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Hour}).set
	a := set.Breaker("http://a.example/hook")
	require.Same(t, a, set.Breaker("http://token@a.example/hook?x=1"), "same endpoint, same breaker")
	other := set.Breaker("http://b.example/hook")
	require.Error(t, a.Execute(fail))
	require.Equal(t, breaker.Open, a.State())
	require.Equal(t, breaker.Closed, other.State())
}

func TestNewSetRejectsBadSettings(t *testing.T) {
	t.Parallel()
	_, err := breaker.NewSet(breaker.Settings{FailureRatio: 1.5}, nil, nil)
	require.ErrorIs(t, err, breaker.ErrInvalidConfig)
	require.ErrorContains(t, err, "FailureRatio 1.5")
	_, err = breaker.NewSet(breaker.Settings{OpenTimeout: -time.Second}, nil, nil)
	require.ErrorIs(t, err, breaker.ErrInvalidConfig)
	require.ErrorContains(t, err, "OpenTimeout -1s")
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	set, err := breaker.NewSet(breaker.Settings{}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, breaker.Settings{
		ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20,
		Interval: 60 * time.Second, OpenTimeout: 30 * time.Second, HalfOpenProbes: 1,
	}, set.Settings())
}

func TestTransitionsAreLogged(t *testing.T) {
	t.Parallel()
	var logs syncBuf
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Millisecond},
		slog.New(slog.NewJSONHandler(&logs, nil)), nil)
	require.NoError(t, err)
	b := set.Breaker("https://user:pw@example.com/hook?token=s3cret")
	require.ErrorIs(t, b.Execute(fail), errDown)
	require.NoError(t, b.Wait(context.Background()))
	require.NoError(t, b.Execute(succeed))
	require.Equal(t, breaker.Closed, b.State())

	out := logs.String()
	for _, tr := range []string{`"from":"closed","to":"open"`, `"from":"open","to":"half-open"`, `"from":"half-open","to":"closed"`} {
		require.Contains(t, out, tr)
	}
	require.Contains(t, out, `"level":"WARN","msg":"circuit breaker transition","endpoint":"https://example.com/hook"`, "opening is a warning")
	require.NotContains(t, out, "s3cret", "the URL's query stays out of logs")
	require.NotContains(t, out, "pw@", "the URL's userinfo stays out of logs")
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
