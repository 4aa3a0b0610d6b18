package shared_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// MaxDeliver counts an event's POSTs over every owner: an event failing
// with a retryable status (503), MaxDeliver 3, ordered and unordered,
// its partition handed to another replica (a graceful stop) after the
// 2nd POST, is POSTed once more by the next owner, then dead-lettered:
// 3 POSTs in all, not 2 + 3. The record's retries entry carries the
// count.
func TestMaxDeliverCountsAcrossAHandOver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and two replicas in turn, and waits for retries (seconds)")
	}
	for _, ordering := range []subscription.Ordering{subscription.OrderingStream, subscription.OrderingNone} {
		t.Run(string(ordering), func(t *testing.T) {
			w, g, q := gateWorld(t, subscription.Subscription{Name: "flaky", Ordering: ordering,
				MaxDeliver: 3, BackOff: []time.Duration{time.Second}, OnDeadLetter: subscription.DeadLetterSkip})
			opts := w.opts
			w.opts = func(c *shared.Config, d *shared.Deps) {
				opts(c, d)
				c.Health.DisableAfter = -1
				set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
				require.NoError(t, err)
				d.Breakers = set
			}
			g.setAnswer(func(string, string) int { return http.StatusServiceUnavailable })
			ids := publishRounds(t, w, 1, 1)
			id := ids[0][0]

			a := w.replica(t, "replica-a")
			require.True(t, waitFor(60*time.Second, func() bool { return g.postsOf("flaky", id) >= 2 }),
				"2 POSTs on the first owner: %d", g.postsOf("flaky", id))
			a.Stop() // the retry pause (1 s) is under way: the record keeps the count
			before := g.postsOf("flaky", id)
			require.Equal(t, 2, before, "the first owner stopped after its 2nd POST")

			b := w.replica(t, "replica-b")
			ok := waitFor(60*time.Second, func() bool { return letters(t, q, "flaky")[id] })
			require.True(t, ok, "dead-lettered by the next owner: %+v", b.Status())
			require.Equal(t, 3, g.postsOf("flaky", id), "MaxDeliver 3 over both owners (2 on the first)")
		})
	}
}
