package drain_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
)

// A cycle's streams are acked together, yet each is settled on its own: a
// poison event blocks its stream only, and a stream whose lease was lost
// during the cycle advances nothing while the others are acked.
func TestCycleSettlesEachStreamOfASharedAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.appendN(t, fmt.Sprintf("ok-%d", i), 2)
	}
	b.appendN(t, "poison-1", 2)
	b.appendN(t, "lost-1", 2)
	rec := newRecorder(func(batch drain.Batch) drain.Result {
		switch batch.Stream {
		case "poison-1":
			return drain.Result{Done: 1, Err: drain.NonRetryable(errors.New("too large for the bus"))}
		case "lost-1":
			// The lease ends while the batch is handled: another bridge
			// holds the stream by the time this one settles.
			require.NoError(t, b.store.Release(b.ctx, "a", []string{"lost-1"}))
			claims, err := b.store.Claim(b.ctx, "other", 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, claims, 1)
		}
		return drain.Result{Done: len(batch.Events)}
	})
	d := b.drain(t, rec, drain.Config{Owner: "a"})

	st, err := d.Cycle(b.ctx)
	require.NoError(t, err)
	require.Equal(t, drain.Stats{Claimed: 7, Forwarded: 11, Acked: 5, Blocked: 1, LeaseLost: 1}, st)
	for i := range 5 {
		si := b.info(t, fmt.Sprintf("ok-%d", i))
		require.Equal(t, int64(1), si.Watermark, si.Stream)
		require.Empty(t, si.LeasedBy, si.Stream)
	}
	p := b.info(t, "poison-1")
	require.True(t, p.Blocked)
	require.Equal(t, int64(0), p.Watermark)
	l := b.info(t, "lost-1")
	require.Equal(t, int64(-1), l.Watermark, "a lost lease advances nothing")
	require.Equal(t, "other", l.LeasedBy)
}
