package deliver_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// opsReceiver records the operational webhooks it gets, verified with
// secret.
type opsReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	hooks []health.OpsWebhook
}

func newOpsReceiver(t *testing.T) *opsReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	o := &opsReceiver{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := v.Verify(r.Header, body); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var h health.OpsWebhook
		if err := json.Unmarshal(body, &h); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		o.hooks = append(o.hooks, h)
		o.mu.Unlock()
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *opsReceiver) received() []health.OpsWebhook {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]health.OpsWebhook(nil), o.hooks...)
}

// A 410 disables the subscription within one attempt per event: nothing
// more is sent, nothing is dead-lettered, the operational event and the
// operational webhook say why; enabling it delivers every event.
func TestGoneDisablesAndEnableResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for deliveries on an embedded JetStream")
	}
	t.Parallel()
	for _, ordering := range []subscription.Ordering{subscription.OrderingNone, subscription.OrderingStream} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			b := setupOrdered(t)
			q := deadletter.New(b.js, deadletter.Config{})
			require.NoError(t, q.Provision(b.ctx))
			ops := newOpsReceiver(t)
			var gone atomic.Bool
			gone.Store(true)
			var mu sync.Mutex
			ok := map[string]bool{}
			delivered := func() int { mu.Lock(); defer mu.Unlock(); return len(ok) }
			rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				if gone.Load() {
					w.WriteHeader(http.StatusGone)
					return
				}
				mu.Lock()
				ok[r.Header.Get("Idempotency-Key")] = true
				mu.Unlock()
			})
			s := orderedSub("orders", rc.URL)
			s.Ordering = ordering
			s.MaxDeliver = 2
			reg := prometheus.NewRegistry()
			b.runOrdered(t, deliver.Config{DeadLetters: q, Registerer: reg,
				Health: health.Config{OpsWebhookURL: ops.URL, OpsWebhookSecret: secret}}, s)
			for v := range int64(3) {
				b.publish(t, "order-1", v, "OrderPlaced")
			}

			require.Eventually(t, func() bool { return len(ops.received()) == 1 }, 15*time.Second, 20*time.Millisecond, "operational webhook")
			hook := ops.received()[0]
			require.Equal(t, wire.OpsWebhookEndpointDisabled, hook.Type)
			require.Equal(t, "orders", hook.Data.Subscription)
			require.Equal(t, health.ReasonGone, hook.Data.Reason)
			require.Equal(t, http.StatusGone, hook.Data.Status)
			require.Contains(t, hook.Data.LastError, "410")

			// The event on ops.endpoint.disabled, in the ops stream.
			ev := lastOpsEvent(t, b.bundle)
			require.Equal(t, "orders", ev.Subscription)
			require.Equal(t, health.ReasonGone, ev.Reason)

			recs, err := health.ReadDisabled(b.ctx, b.js)
			require.NoError(t, err)
			require.Len(t, recs, 1)
			require.Equal(t, "orders", recs[0].Subscription)
			require.Equal(t, 1.0, disabledGauge(reg, "orders"))

			// No more requests while disabled: at most one attempt per
			// event (unordered: those in flight together), none after.
			sent := len(rc.requests())
			require.LessOrEqual(t, sent, 3)
			require.Never(t, func() bool { return len(rc.requests()) > sent }, time.Second, 50*time.Millisecond, "sent while disabled")

			gone.Store(false)
			was, err := health.Enable(b.ctx, b.js, "orders")
			require.NoError(t, err)
			require.True(t, was)
			require.Eventually(t, func() bool { return delivered() == 3 }, 15*time.Second, 20*time.Millisecond, "every event delivered after enable")
			n, err := q.Count(b.ctx, "")
			require.NoError(t, err)
			require.Zero(t, n, "nothing dead-lettered")
			require.Equal(t, 0.0, disabledGauge(reg, "orders"))
			require.Len(t, ops.received(), 1, "one disable, one operational webhook")
		})
	}
}

// lastOpsEvent reads the last operational event from the ops stream.
func lastOpsEvent(t *testing.T, b bundle) health.DisabledRecord {
	t.Helper()
	var rec health.DisabledRecord
	require.Eventually(t, func() bool {
		s, err := b.js.Stream(b.ctx, wire.DefaultOpsStream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(b.ctx, wire.SubjectEndpointDisabled)
		if err != nil {
			return false
		}
		return json.Unmarshal(m.Data, &rec) == nil
	}, 10*time.Second, 20*time.Millisecond, "event on %s", wire.SubjectEndpointDisabled)
	return rec
}

// disabledGauge returns jsbridge_consumer_endpoint_disabled of
// subscription name.
func disabledGauge(reg *prometheus.Registry, name string) float64 {
	v, _ := gaugeOf(reg, "jsbridge_consumer_endpoint_disabled", "subscription", name)
	return v
}

// An endpoint failing without a success for DisableAfter (on the engine's
// clock) across DisableMinFailures attempts disables its subscription.
func TestSustainedFailureDisables(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for deliveries on an embedded JetStream")
	}
	t.Parallel()
	b := setup(t)
	clock := clockwork.NewFakeClock()
	var fails atomic.Int32
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		fails.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})
	never, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1 << 30, MinRequests: 1 << 30}, nil, nil)
	require.NoError(t, err)
	s := sub("orders", rc.URL)
	s.MaxDeliver = -1
	// The retry delays are Naks with a delay, on the server's clock.
	s.BackOff = []time.Duration{20 * time.Millisecond}
	b.run(t, deliver.Config{Breakers: never, Clock: clock, Health: health.Config{DisableAfter: time.Hour, DisableMinFailures: 3}}, s)
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)

	require.Eventually(t, func() bool { return fails.Load() >= 5 }, 10*time.Second, 10*time.Millisecond)
	recs, err := health.ReadDisabled(b.ctx, b.js)
	require.NoError(t, err)
	require.Empty(t, recs, "failing for less than DisableAfter: still enabled")

	clock.Advance(time.Hour)
	require.Eventually(t, func() bool {
		recs, err := health.ReadDisabled(b.ctx, b.js)
		return err == nil && len(recs) == 1 && recs[0].Reason == health.ReasonFailing
	}, 10*time.Second, 10*time.Millisecond, "disabled after an hour of failures")
	n := fails.Load()
	require.Never(t, func() bool { return fails.Load() > n+1 }, time.Second, 50*time.Millisecond, "sent while disabled")
}

// A receiver answering 429 to more than 5 requests/s: the throttle
// settles the delivered rate near 5/s, and no event is dead-lettered
// although MaxDeliver is 2 (a throttled attempt spends none).
func TestThrottleConvergesOn429(t *testing.T) {
	if testing.Short() {
		t.Skip("delivers for about 15 s on an embedded JetStream")
	}
	t.Parallel()
	for _, ordering := range []subscription.Ordering{subscription.OrderingNone, subscription.OrderingStream} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			testThrottleConverges(t, ordering)
		})
	}
}

func testThrottleConverges(t *testing.T, ordering subscription.Ordering) {
	b := setupOrdered(t)
	q := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, q.Provision(b.ctx))
	const perSecond, events = 5, 60
	var mu sync.Mutex
	var accepted []time.Time // within the last second
	var acks []time.Time
	var throttled int
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		for len(accepted) > 0 && now.Sub(accepted[0]) >= time.Second {
			accepted = accepted[1:]
		}
		if len(accepted) >= perSecond {
			throttled++
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		accepted = append(accepted, now)
		acks = append(acks, now)
	})
	s := orderedSub("orders", rc.URL)
	s.Ordering = ordering
	s.MaxDeliver = 2
	s.MaxInFlight = 8
	b.runOrdered(t, deliver.Config{DeadLetters: q}, s)
	for i := range int64(events) {
		b.publish(t, "order-"+strconv.FormatInt(i%7, 10), i/7, "OrderPlaced")
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acks) == events }, 40*time.Second, 20*time.Millisecond)
	n, err := q.Count(b.ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "nothing dead-lettered")

	mu.Lock()
	defer mu.Unlock()
	// The rate over the second half, once the throttle has settled.
	half := acks[events/2:]
	rate := float64(len(half)-1) / half[len(half)-1].Sub(half[0]).Seconds()
	t.Logf("delivered %.2f/s over the second half; %d answers were 429", rate, throttled)
	require.InDelta(t, perSecond, rate, 1.5, "delivered rate near %d/s", perSecond)
	require.Less(t, throttled, events, "the throttle keeps the 429s few")
}

// Three replicas and a dead endpoint: the breakers they share let one
// probe through per open timeout, not three; when the endpoint heals,
// every replica's breaker closes with the probe that succeeded.
func TestSharedBreakerOneProbePerOpenTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three replicas for several seconds on an embedded JetStream")
	}
	t.Parallel()
	for _, ordering := range []subscription.Ordering{subscription.OrderingNone, subscription.OrderingStream} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			testSharedBreaker(t, ordering)
		})
	}
}

func testSharedBreaker(t *testing.T, ordering subscription.Ordering) {
	b := setupOrdered(t)
	var healed atomic.Bool
	var mu sync.Mutex
	var failedAt []time.Time
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if healed.Load() {
			return
		}
		mu.Lock()
		failedAt = append(failedAt, time.Now())
		mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
	})
	s := orderedSub("orders", rc.URL)
	s.Ordering = ordering
	s.MaxDeliver = -1
	const openTimeout = time.Second
	var sets []*breaker.Set
	for i := range 3 {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: openTimeout}, nil, nil)
		require.NoError(t, err)
		sets = append(sets, set)
		b.runOrdered(t, deliver.Config{Breakers: set, ReplicaID: "replica-" + strconv.Itoa(i)}, s)
	}
	for i := range int64(20) {
		b.publish(t, "order-"+strconv.FormatInt(i, 10), 0, "OrderPlaced")
	}
	require.Eventually(t, func() bool {
		for _, set := range sets {
			if set.Breaker(rc.URL).State() == breaker.Closed {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "open on every replica")

	// POSTs admitted before a replica's breaker opened may still be on
	// their way (a burst of up to max_in_flight per replica; under load
	// they arrive late): count from a moment the receiver has been quiet
	// for half an open timeout, when only probes come.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failedAt) > 0 && time.Since(failedAt[len(failedAt)-1]) > openTimeout/2
	}, 10*time.Second, 10*time.Millisecond, "the POSTs in flight when the breakers opened have arrived")
	// Count the requests over 5 open timeouts.
	mu.Lock()
	from := len(failedAt)
	mu.Unlock()
	sent := func() int { mu.Lock(); defer mu.Unlock(); return len(failedAt) - from }
	require.Never(t, func() bool { return sent() > 7 }, 5*openTimeout, 10*time.Millisecond,
		"about one probe per open timeout, not one per replica (three replicas: 15)")
	t.Logf("%d requests in 5 open timeouts with 3 replicas", sent())
	require.GreaterOrEqual(t, sent(), 3, "probes go on")

	healed.Store(true)
	require.Eventually(t, func() bool {
		for _, set := range sets {
			if set.Breaker(rc.URL).State() != breaker.Closed {
				return false
			}
		}
		return true
	}, 3*openTimeout, 10*time.Millisecond, "closed on every replica after one successful probe")
	require.Eventually(t, func() bool {
		ids := map[string]bool{}
		for _, r := range rc.requests() {
			ids[r.header.Get("Idempotency-Key")] = true
		}
		return len(ids) == 20
	}, 20*time.Second, 20*time.Millisecond, "every event delivered once healed")
}

// An operator's disable stops a running subscription within a second and
// keeps its events; enable delivers them.
func TestOperatorDisableAndEnable(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for deliveries on an embedded JetStream")
	}
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	b.run(t, deliver.Config{}, sub("orders", rc.URL))
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	require.Eventually(t, func() bool { return len(rc.requests()) == 1 }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, health.SetDisabled(b.ctx, b.js, "orders", health.ReasonOperator, time.Now()))
	recs, err := health.ReadDisabled(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, health.ReasonOperator, recs[0].Reason)
	// The replica applies it from its watch: wait until it stopped
	// pulling (no pull request waiting on the durable consumer).
	require.Eventually(t, func() bool { return b.info(t, "orders").NumWaiting == 0 }, 5*time.Second, 10*time.Millisecond)
	b.publish(t, 2, "order-1", "OrderPlaced", `{}`)
	require.Never(t, func() bool { return len(rc.requests()) > 1 }, time.Second, 20*time.Millisecond, "sent while disabled")
	require.EqualValues(t, 1, b.info(t, "orders").NumPending, "the event waits in JetStream")

	was, err := health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.True(t, was)
	require.Eventually(t, func() bool { return len(rc.requests()) == 2 }, 10*time.Second, 10*time.Millisecond, "delivered after enable")
	was, err = health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.False(t, was, "enabled already")
}
