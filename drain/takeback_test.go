package drain_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/event"
)

// lostAnswers is the store as a Postgres failover leaves it for a live
// drainer: the first ack and the first claim it is told to lose fail on
// the client although nothing (ack) or everything (claim) was applied.
type lostAnswers struct {
	drain.Store
	mu        sync.Mutex
	loseAck   bool
	loseClaim bool
}

func (s *lostAnswers) AckStreams(ctx context.Context, owner string, acks []event.Progress) []error {
	s.mu.Lock()
	lose := s.loseAck
	s.loseAck = false
	s.mu.Unlock()
	if !lose {
		return s.Store.AckStreams(ctx, owner, acks)
	}
	errs := make([]error, len(acks))
	for i := range errs {
		errs[i] = errors.New("FATAL: terminating connection due to immediate shutdown command")
	}
	return errs
}

func (s *lostAnswers) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]event.Claim, error) {
	claims, err := s.Store.Claim(ctx, owner, limit, lease)
	s.mu.Lock()
	lose := s.loseClaim
	s.loseClaim = false
	s.mu.Unlock()
	if lose && err == nil {
		return nil, errors.New("unexpected EOF")
	}
	return claims, err
}

// A settle or a claim whose answer was lost leaves leases this drainer
// holds and will not settle; with an hour's lease, the streams must come
// back at the next cycle, not in an hour, and their next batch reconciles.
func TestLeasesLeftByLostAnswersAreTakenBackAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendN(t, "cut-1", 2)
	b.appendN(t, "cut-2", 1)
	st := &lostAnswers{Store: b.store, loseAck: true}
	var mu sync.Mutex
	reconciled := map[string][]bool{}
	rec := newRecorder(func(bt drain.Batch) drain.Result {
		mu.Lock()
		defer mu.Unlock()
		reconciled[bt.Stream] = append(reconciled[bt.Stream], bt.Reconcile)
		return drain.Result{Done: len(bt.Events)}
	})
	d, err := drain.New(st, rec, drain.Config{Owner: "live", Lease: time.Hour, Logger: quiet()})
	require.NoError(t, err)

	cs, err := d.Cycle(b.ctx)
	require.Error(t, err, "the ack's answer was lost")
	require.Equal(t, 2, cs.Claimed)
	require.Equal(t, "live", b.info(t, "cut-1").LeasedBy, "the lease survives the lost ack")

	cs, err = d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, cs.Acked, "both streams taken back at the next cycle")
	for _, s := range []string{"cut-1", "cut-2"} {
		info := b.info(t, s)
		require.Zero(t, info.Lag, s)
		require.Empty(t, info.LeasedBy, s)
		require.Zero(t, info.Retry, s)
	}
	mu.Lock()
	require.Equal(t, map[string][]bool{"cut-1": {false, true}, "cut-2": {false, true}}, reconciled,
		"the batch after the lost ack reconciles with the bus")
	mu.Unlock()

	// A claim committed whose answer was lost.
	b.appendN(t, "cut-1", 1)
	st.mu.Lock()
	st.loseClaim = true
	st.mu.Unlock()
	_, err = d.Cycle(b.ctx)
	require.Error(t, err)
	require.Equal(t, "live", b.info(t, "cut-1").LeasedBy, "claimed, unknown to the drainer")
	cs, err = d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, cs.Acked)
	require.Zero(t, b.info(t, "cut-1").Lag)
}
