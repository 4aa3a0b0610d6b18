package shared_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// publishRounds stores rounds events on each of n streams (stuck-0,
// stuck-1, …), round by round, each stream's versions from 0, and
// returns their event ids by version (round).
func publishRounds(t *testing.T, w *world, n, rounds int) [][]string {
	t.Helper()
	ids := make([][]string, rounds)
	for v := range rounds {
		for s := range n {
			w.next++
			e := event.Event{ID: int64(w.next), Stream: fmt.Sprintf("stuck-%d", s), Version: int64(v),
				Name: "Noted", Data: []byte(`{}`), Created: time.Now()}
			_, err := w.js.PublishMsg(t.Context(), forward.Message(e, forward.Config{}))
			require.NoError(t, err)
			ids[v] = append(ids[v], event.FormatID(e.ID))
		}
	}
	return ids
}

// waitFor polls cond every 20 ms until it holds (true) or d passed
// (false), so that a failure's message is made after the wait.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// letters returns the event ids dead-lettered for sub.
func letters(t *testing.T, q *deadletter.DLQ, sub string) map[string]bool {
	t.Helper()
	got, err := q.List(t.Context(), sub)
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, d := range got {
		out[d.EventID] = true
	}
	return out
}

// A dead endpoint (every POST answered 503) behind a breaker that opens
// and lets a probe through every 2 s, MaxDeliver 1, ordered, a few
// streams: the heads the open breaker holds are set aside as stuck, and
// once each is dead-lettered the events queued behind it are attempted
// and dead-lettered too, every one of them (integration's
// TestStartupConsumerOutlivesADeadEndpoint, at the engine's level).
func TestEventsQueuedBehindAStuckHeadAreAttemptedWithTheBreakerOpen(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica, and waits for stuck streams (seconds)")
	}
	w, g, q := gateWorld(t, subscription.Subscription{Name: "dead", Ordering: subscription.OrderingStream,
		MaxDeliver: 1, MaxInFlight: 2, BackOff: []time.Duration{100 * time.Millisecond}, OnDeadLetter: subscription.DeadLetterSkip})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.Health.DisableAfter = -1
		set, err := breaker.NewSet(breaker.Settings{OpenTimeout: 2 * time.Second}, nil, nil)
		require.NoError(t, err)
		d.Breakers = set
	}
	g.setAnswer(func(string, string) int { return http.StatusServiceUnavailable })
	ids := publishRounds(t, w, 3, 4)
	r := w.replica(t, "replica-a")
	ok := waitFor(60*time.Second, func() bool { return len(letters(t, q, "dead")) == w.next })
	require.True(t, ok, "every event dead-lettered: %d of %d; %+v", len(letters(t, q, "dead")), w.next, r.Status())
	for v, round := range ids {
		for _, id := range round {
			require.Equal(t, 1, g.postsOf("dead", id), "version %d, event %s: MaxDeliver 1", v, id)
		}
	}
}

// An endpoint that refuses each stream's first event (503) and accepts
// the others, a breaker that never opens: each head is retried in place
// until its stream is set aside as stuck (after the last event was
// read: nothing else wakes the dispatch loop), then dead-lettered at
// MaxDeliver, and the events queued behind it are read again and
// delivered, each naming the dead letter's predecessor (none).
func TestEventsQueuedBehindAStuckHeadAreDeliveredAfterItsDeadLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica, and waits for stuck streams (seconds)")
	}
	w, g, q := gateWorld(t, subscription.Subscription{Name: "dead", Ordering: subscription.OrderingStream,
		MaxDeliver: 10, BackOff: []time.Duration{200 * time.Millisecond}, OnDeadLetter: subscription.DeadLetterSkip})
	opts := w.opts
	w.opts = func(c *shared.Config, d *shared.Deps) {
		opts(c, d)
		c.Health.DisableAfter = -1
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
		require.NoError(t, err)
		d.Breakers = set
	}
	// Six rounds: five events queued behind each head set its stream
	// aside a second into its retries, before MaxDeliver (2 s) ends them.
	const n, rounds = 3, 6
	heads := map[string]bool{}
	ids := publishRounds(t, w, n, rounds)
	for _, id := range ids[0] {
		heads[id] = true
	}
	g.setAnswer(func(_, id string) int {
		if heads[id] {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	r := w.replica(t, "replica-a")
	ok := waitFor(60*time.Second, func() bool { return len(letters(t, q, "dead")) == n })
	require.True(t, ok, "each head dead-lettered: %d of %d; %+v", len(letters(t, q, "dead")), n, r.Status())
	ok = waitFor(60*time.Second, func() bool { return g.received("dead") == n*(rounds-1) })
	require.True(t, ok, "the events queued behind the heads delivered: %d of %d; %+v", g.received("dead"), n*(rounds-1), r.Status())
	breaks, bad := g.problems()
	require.Empty(t, breaks, "the chains")
	require.Zero(t, bad)
	for s := range n {
		require.Equal(t, []int64{1, -1, 2, 1, 3, 2, 4, 3, 5, 4}, g.chain("dead", fmt.Sprintf("stuck-%d", s)),
			"stuck-%d: version 1 names none (its predecessor dead-lettered)", s)
	}
}
