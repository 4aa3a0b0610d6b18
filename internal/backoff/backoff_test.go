package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/backoff"
)

func TestDefaultsDoubleFromHalfASecondToFifteenWithTwentyPercentJitter(t *testing.T) {
	t.Parallel()
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 15 * time.Second, 15 * time.Second}
	for range 200 {
		var b backoff.Backoff
		for i, w := range want {
			got := b.Next()
			lo, hi := time.Duration(float64(w)*0.8), time.Duration(float64(w)*1.2)
			require.True(t, got >= lo && got <= hi, "pause %d: %s not within %s..%s", i, got, lo, hi)
		}
	}
}

func TestJitterSpreadsPauses(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for range 50 {
		b := backoff.Backoff{Min: time.Second, Max: time.Second}
		seen[b.Next()] = true
	}
	require.Greater(t, len(seen), 10, "50 first pauses with jitter are not all alike")
}

func TestResetStartsOverAndNoJitterIsExact(t *testing.T) {
	t.Parallel()
	b := backoff.Backoff{Min: 10 * time.Millisecond, Max: 35 * time.Millisecond, Jitter: -1}
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 35 * time.Millisecond, 35 * time.Millisecond},
		[]time.Duration{b.Next(), b.Next(), b.Next(), b.Next()})
	b.Reset()
	require.Equal(t, 10*time.Millisecond, b.Next())
}

func TestSleepEndsWithTheContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.False(t, backoff.Sleep(ctx, time.Hour))
	require.Less(t, time.Since(start), time.Second)
	require.True(t, backoff.Sleep(context.Background(), time.Millisecond))
}
