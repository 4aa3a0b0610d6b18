package deliver

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// A message type is needed only as a carrier here; lanes never call it.
type laneMsg struct {
	jetstream.Msg
	key string
	n   int
}

func TestLanesKeepOrderPerKeyAndRunKeysConcurrently(t *testing.T) {
	t.Parallel()
	var l lanes
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string][]int{}
	running := map[string]int{}
	maxRunningKeys := 0

	for n := range 50 {
		for k := range 4 {
			key := fmt.Sprintf("k%d", k)
			l.submit(key, laneMsg{key: key, n: n}, &wg, func(m jetstream.Msg) {
				lm := m.(laneMsg)
				mu.Lock()
				running[lm.key]++
				if running[lm.key] != 1 {
					t.Errorf("two deliveries of %s at once", lm.key)
				}
				maxRunningKeys = max(maxRunningKeys, len(running))
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
				mu.Lock()
				got[lm.key] = append(got[lm.key], lm.n)
				if running[lm.key]--; running[lm.key] == 0 {
					delete(running, lm.key)
				}
				mu.Unlock()
			}, nil)
		}
	}
	wg.Wait()
	for k := range 4 {
		seq := got[fmt.Sprintf("k%d", k)]
		require.Len(t, seq, 50)
		for i, n := range seq {
			require.Equal(t, i, n, "key k%d out of order: %v", k, seq)
		}
	}
	require.Greater(t, maxRunningKeys, 1, "different keys never ran concurrently")
	require.Empty(t, l.busy)
}
