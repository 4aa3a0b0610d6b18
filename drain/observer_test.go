package drain_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

type recordingObserver struct {
	mu       sync.Mutex
	claimed  []int
	settled  map[string]string
	fwd      int
	claimErr error
}

func (o *recordingObserver) Claimed(n int, took time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.claimed = append(o.claimed, n)
	if err != nil {
		o.claimErr = err
	}
}

func (o *recordingObserver) Settled(stream, how string, forwarded int, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.settled[stream] = how
	o.fwd += forwarded
}

func TestObserverSeesClaimsAndSettles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "ok-1", 3)
	b.appendN(t, "bad-1", 2)
	h := newRecorder(func(bt drain.Batch) drain.Result {
		if bt.Stream == "bad-1" {
			return drain.Result{Done: 1, Err: errors.New("bus down")}
		}
		return drain.Result{Done: len(bt.Events)}
	})
	obs := &recordingObserver{settled: map[string]string{}}
	d := b.drain(t, h, drain.Config{Observer: obs, Backoff: func(int) time.Duration { return time.Hour }})
	_, err := d.Cycle(b.ctx)
	require.NoError(t, err)

	require.Equal(t, []int{2}, obs.claimed)
	require.NoError(t, obs.claimErr)
	require.Equal(t, map[string]string{"ok-1": drain.SettledAcked, "bad-1": drain.SettledRetried}, obs.settled)
	require.Equal(t, 4, obs.fwd, "3 acked + 1 partial progress")
}
