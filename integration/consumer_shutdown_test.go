package integration

import (
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SIGTERM with deliveries in flight: the consumer process stops pulling,
// finishes the POSTs it started (they are acked), returns what it pulled
// but had not started, and exits 0 well within AckWait, leaving nothing
// waiting for AckWait. A new process then delivers the rest, each event
// once.
func TestConsumerGracefulShutdownOnSIGTERM(t *testing.T) {
	t.Parallel()
	const (
		events = 200
		// Long beside what the test waits for (an exit and a restart's
		// deliveries, seconds), so that a loaded machine stretching those
		// does not reach half of it: the test tells Nak'd from left to
		// AckWait, not fast from slow.
		ackWait = 2 * time.Minute
	)
	b := setupJetStream(t)
	var running atomic.Int32
	var slow atomic.Bool
	slow.Store(true)
	ep := newHits(t, func(w http.ResponseWriter, _ *http.Request) {
		running.Add(1)
		defer running.Add(-1)
		if slow.Load() {
			time.Sleep(time.Second)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	args := []string{"run", "--nats-url", b.srv.ClientURL(), "--start", "all", "--name", "graceful", "--url", ep.URL, "--allow-private",
		"--max-in-flight", "20", "--ack-wait", ackWait.String(), "--timeout", "5s", "--ops-addr", ""}
	first := startProc(t, env, "consumer", args...)
	b.publish(t, 1, events, events)
	require.Eventually(t, func() bool { return running.Load() >= 10 }, 30*time.Second, 10*time.Millisecond)

	stopped := time.Now()
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-first.exited:
	case <-time.After(ackWait):
		t.Fatalf("consumer still running %s after SIGTERM", ackWait)
	}
	took := time.Since(stopped)
	require.NoError(t, first.err, "exit status after SIGTERM; output:\n%s", first.out.String())
	require.Less(t, took, ackWait/2, "exit within AckWait")
	t.Logf("exited %s after SIGTERM with %d requests sent", took.Round(time.Millisecond), ep.count())

	sent := ep.count()
	require.Greater(t, sent, 0)
	require.Less(t, sent, events, "the test stopped the consumer mid-way")

	// What the first process had pulled but not sent was Nak'd, not left
	// to AckWait: a new process delivers everything well before AckWait.
	slow.Store(false)
	startProc(t, env, "consumer", args...)
	require.Eventually(t, func() bool { return ep.count() >= events }, ackWait/2, 50*time.Millisecond,
		"every event delivered within half of AckWait of the restart")
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, events, ep.count(), "no event sent twice")
	require.Equal(t, events, ep.distinct())
}
