package deliver_test

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/wire"
)

// The time part of the sustained-failure rule survives a restart: the
// failure streak's start is in the health bucket once a replica counted
// DisableMinFailures, so a replica started after DisableAfter disables
// the subscription after DisableMinFailures failures of its own, not
// after another DisableAfter. A 2xx deletes the streak.
func TestFailureStreakSurvivesARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for deliveries on an embedded JetStream")
	}
	t.Parallel()
	b := setup(t)
	clock := clockwork.NewFakeClock()
	started := clock.Now()
	var fails atomic.Int32
	var healthy atomic.Bool
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if healthy.Load() {
			return
		}
		fails.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})
	never, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
	require.NoError(t, err)
	s := sub("orders", rc.URL)
	s.MaxDeliver = -1
	s.BackOff = []time.Duration{20 * time.Millisecond} // Naks with a delay, on the server's clock
	cfg := deliver.Config{Breakers: never, Clock: clock, Health: health.Config{DisableAfter: time.Hour, DisableMinFailures: 3}}
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultHealthBucket)
	if err != nil {
		kv, err = b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultHealthBucket})
		require.NoError(t, err)
	}
	streak := func() (time.Time, bool) {
		e, err := kv.Get(b.ctx, wire.StreakKey("orders"))
		if err != nil {
			return time.Time{}, false
		}
		var rec struct{ Since time.Time }
		require.NoError(t, json.Unmarshal(e.Value(), &rec))
		return rec.Since, true
	}

	// The first replica fails three times: the streak is in the bucket,
	// started at its first failure.
	// runStopped: the first replica has stopped for good before the
	// clock moves on, or a failure it still had in hand would count
	// under the old streak and disable the subscription itself.
	stop := b.runStopped(t, cfg, s)
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	require.Eventually(t, func() bool { _, ok := streak(); return ok }, 10*time.Second, 10*time.Millisecond, "streak written")
	since, _ := streak()
	require.True(t, since.Equal(started), "since %s, first failure at %s", since, started)
	stop()

	// An hour later (DisableAfter), a new replica: its own streak starts
	// now, yet the shared start disables after three failures.
	clock.Advance(time.Hour)
	n := fails.Load()
	b.run(t, cfg, s)
	require.Eventually(t, func() bool {
		recs, err := health.ReadDisabled(b.ctx, b.js)
		return err == nil && len(recs) == 1 && recs[0].Reason == health.ReasonFailing
	}, 10*time.Second, 10*time.Millisecond, "disabled by the shared streak")
	require.GreaterOrEqual(t, fails.Load()-n, int32(3), "three failures of its own first")

	// Enabled: the streak ends with it. Failing three times again writes
	// a new one (from now); the next 2xx deletes it.
	_, err = health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.Eventually(t, func() bool { since, ok := streak(); return ok && since.Equal(clock.Now()) }, 10*time.Second, 10*time.Millisecond,
		"a new streak after enable")
	healthy.Store(true)
	require.Eventually(t, func() bool { _, ok := streak(); return !ok }, 10*time.Second, 10*time.Millisecond, "a 2xx deletes the streak")
	require.Eventually(t, func() bool { return len(rc.requests()) > int(fails.Load()) }, 10*time.Second, 10*time.Millisecond, "delivered")
}
