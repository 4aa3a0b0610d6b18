package shared_test

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// BenchmarkDeliver is the engine's cost of one webhook, end to end in one
// process: one replica holding all 16 partitions reads events from the
// embedded JetStream and delivers each to one ordered and one unordered
// subscription (the live pipeline row's shape) at a receiver that
// verifies every signature, in structured and in binary mode, b.N events
// over 1,000 streams published at once. Per webhook: cpu-ns (the
// process's CPU time: the replica, and beside it the server storing the
// events and the receiver), allocs and B (runtime.MemStats). The server
// and the receiver are the same before and after a change of the
// engine's; run with -benchtime 4000x or so (issue 33,
// docs/performance.md).
func BenchmarkDeliver(b *testing.B) {
	for _, body := range []subscription.BodyMode{subscription.BodyStructured, subscription.BodyBinary} {
		b.Run("body="+string(body), func(b *testing.B) {
			w := newWorld(b)
			for i := range w.subs {
				w.subs[i].Body = body
			}
			r := w.replica(b, "replica-a")
			require.Eventually(b, func() bool { return len(r.Owned()) == 16 }, 30*time.Second, 10*time.Millisecond)
			publishAsync(b, w, 1000) // warm: connections, lanes, the records' entries
			received(b, w)

			var m0, m1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m0)
			cpu := cpuTime()
			b.ResetTimer()
			publishAsync(b, w, b.N)
			received(b, w)
			b.StopTimer()
			spent := cpuTime() - cpu
			runtime.ReadMemStats(&m1)
			webhooks := float64(2 * b.N)
			b.ReportMetric(float64(spent.Nanoseconds())/webhooks, "cpu-ns/webhook")
			b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/webhooks, "allocs/webhook")
			b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/webhooks, "B/webhook")
			b.ReportMetric(float64(m1.NumGC-m0.NumGC), "gc")
		})
	}
}

// benchStreams is how many streams BenchmarkDeliver's events go round.
const benchStreams = 1000

// publishAsync stores n more events as the bridge does (forward.Message),
// round robin over benchStreams streams, without waiting for each
// PubAck.
func publishAsync(tb testing.TB, w *world, n int) {
	tb.Helper()
	for range n {
		k := w.next
		e := event.Event{ID: int64(k + 1), Stream: fmt.Sprintf("order-%d", k%benchStreams), Version: int64(k / benchStreams),
			Name: "Placed", Data: []byte(fmt.Sprintf(`{"k":%d}`, k)), Created: time.Now()}
		_, err := w.js.PublishMsgAsync(forward.Message(e, forward.Config{}))
		require.NoError(tb, err)
		w.next++
	}
	select {
	case <-w.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		tb.Fatal("the events' PubAcks did not come within 30 s")
	}
}

// received waits until both subscriptions received every event
// published (the receiver's order check reads the binary mode's
// headers: BenchmarkDeliver leaves it to the tests).
func received(tb testing.TB, w *world) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		return w.rc.received("/ordered") == w.next && w.rc.received("/unordered") == w.next
	}, 90*time.Second, 5*time.Millisecond, "every event to each subscription")
}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
