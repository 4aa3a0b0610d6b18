package deliver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/wire"
)

// A burst of records (most of them sharing a PubAck, see attemptlog.Run)
// is stored whole and in order; with no attempts stream the whole burst
// is counted as dropped, not only the records that asked for a PubAck.
func TestAttemptLogBurstSharesPubAcks(t *testing.T) {
	t.Parallel()
	const n = 40 // two and a half runs of ackEvery (16)
	for _, provision := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream %v", provision), func(t *testing.T) {
			b := setup(t)
			reg := prometheus.NewRegistry()
			stream := "ATTEMPTS_" + fmt.Sprint(provision)
			l, err := attemptlog.New(b.js, attemptlog.Config{Stream: stream, SubjectPrefix: "att" + fmt.Sprint(provision), Registerer: reg})
			require.NoError(t, err)
			if provision {
				require.NoError(t, l.Provision(b.ctx))
			}
			// Queued before Run starts: a run of records behind each one.
			for i := range n {
				l.RecordAttempt(attemptlog.Attempt{Subscription: "orders", EventID: fmt.Sprint(i + 1), Attempt: 1})
			}
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { l.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			dropped := func() float64 {
				return counterWith(reg, "jsbridge_consumer_attempt_records_dropped_total", "reason", "error")
			}
			if !provision {
				require.Eventually(t, func() bool { return dropped() == n }, 10*time.Second, 10*time.Millisecond, "dropped %v of %d", dropped(), n)
				return
			}
			s, err := b.js.Stream(b.ctx, stream)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				info, err := s.Info(b.ctx)
				return err == nil && info.State.Msgs == n
			}, 10*time.Second, 10*time.Millisecond)
			for i := range n {
				m, err := s.GetMsg(b.ctx, uint64(i+1))
				require.NoError(t, err)
				require.Equal(t, wire.AttemptSubject("atttrue", "orders", fmt.Sprint(i+1)), m.Subject)
			}
			require.Zero(t, dropped())
		})
	}
}
