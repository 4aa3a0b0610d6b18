package shared_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
)

// Replicas whose subscription sets differ, as during a rolling deploy
// that adds a subscription: replica a delivers "ordered" and
// "unordered", replica b only "unordered". While b holds a partition it
// keeps the place of "ordered" (a held cursor: the floor passes it, its
// events stay owed); when a replica that delivers it claims the
// partition again, it reads from there and rejoins. "ordered" gets every
// event once, each stream in order, none lost.
func TestAStrangersPlaceIsHeldUntilAReplicaThatDeliversItClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and three replicas, and delivers 2,000 events")
	}
	w := newWorld(t)
	unorderedOnly := w.subs[1:]
	require.Equal(t, "unordered", unorderedOnly[0].Name)
	regs := map[string]*prometheus.Registry{}
	w.opts = func(cfg *shared.Config, deps *shared.Deps) {
		if cfg.Replica == "replica-b" {
			deps.Subscriptions = unorderedOnly
		}
		regs[cfg.Replica] = prometheus.NewRegistry()
		deps.Registerer = regs[cfg.Replica]
	}
	a := w.replica(t, "replica-a")
	w.publish(t, 500)
	w.delivered(t, a)

	b := w.replica(t, "replica-b")
	require.Eventually(t, func() bool { return len(b.Owned()) > 0 }, 30*time.Second, 20*time.Millisecond, "b takes a share")
	w.publish(t, 250)
	a.Stop() // b takes a's partitions while events flow
	w.publish(t, 250)
	require.Eventually(t, func() bool { return w.rc.received("/unordered") == w.next && len(b.Owned()) == 16 },
		90*time.Second, 20*time.Millisecond, "b delivers unordered alone, on every partition")
	held := 0
	for _, ps := range b.Status() {
		if ps.Behind["ordered"] == fanout.StateHeld {
			held++
		}
	}
	require.Equal(t, 16, held, "b holds the place of the subscription it does not deliver on every partition: %+v", b.Status())
	require.Less(t, w.rc.received("/ordered"), w.next, "b sent nothing to ordered")
	// A hand-over cuts the POSTs in flight (a's graceful stop, b's
	// join): those the receiver had processed come again (at least
	// once). From here on only a2 sends to ordered.
	dupes := w.rc.duplicates("/ordered")
	t.Logf("before a2: ordered received %d of %d, %d duplicates", w.rc.received("/ordered"), w.next, dupes)

	// a comes back (a new replica with both), and b goes: a claims every
	// partition and resumes ordered from its held place.
	a2 := w.replica(t, "replica-a2")
	w.publish(t, 500)
	require.Eventually(t, func() bool { return len(a2.Owned()) > 0 }, 30*time.Second, 20*time.Millisecond, "a2 takes a share")
	b.Stop()
	w.publish(t, 500)
	w.delivered(t, a2)
	// A partition a2 lost (a lease the machine was too slow to renew, a
	// record claimed meanwhile) has its settlements not yet committed
	// and its POSTs cut sent again: at least once.
	if n := promregtest.Value(t, regs["replica-a2"], "jsbridge_consumer_shared_handovers_total", "direction", "released"); n == 0 {
		require.Equal(t, dupes, w.rc.duplicates("/ordered"), "ordered got each of the events held for it once")
	} else {
		t.Logf("a2 lost %v partitions on a slow machine: ordered got %d events twice", n, w.rc.duplicates("/ordered")-dupes)
	}
	require.Eventually(t, func() bool {
		for _, ps := range a2.Status() {
			if len(ps.Behind) > 0 {
				return false
			}
		}
		return len(a2.Owned()) == 16
	}, 30*time.Second, 20*time.Millisecond, "every cursor rejoined: %+v", a2.Status())
}
