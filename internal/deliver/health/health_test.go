package health_test

import (
	"context"
	"encoding/base64"
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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/promreg/promregtest"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("health-test-secret-0123456789"))

// wait bounds every condition a test polls for.
const wait = 5 * time.Second

// bundle is one test's JetStream, fake clock and context.
type bundle struct {
	ctx   context.Context
	js    jetstream.JetStream
	clock *clockwork.FakeClock
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	return bundle{ctx: ctx, js: js, clock: clockwork.NewFakeClock()}
}

// start returns a State of replica on b's JetStream and clock, its
// disabled keys loaded and followed until the test ends.
func (b bundle) start(t *testing.T, replica string, cfg health.Config, d health.Deps, names ...string) *health.State {
	t.Helper()
	d.JetStream, d.Archetype = b.js, base.New(b.clock, nil, replica)
	s, err := health.New(cfg, d, names)
	require.NoError(t, err)
	require.NoError(t, s.Start(b.ctx))
	t.Cleanup(s.Stop)
	return s
}

// streak returns the start of subscription name's streak key, and
// whether there is one.
func (b bundle) streak(t *testing.T, name string) (time.Time, bool) {
	t.Helper()
	kv, err := b.js.KeyValue(b.ctx, wire.DefaultHealthBucket)
	require.NoError(t, err)
	e, err := kv.Get(b.ctx, wire.StreakKey(name))
	if err != nil {
		return time.Time{}, false
	}
	var rec struct{ Since time.Time }
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	return rec.Since, true
}

// opsReceiver records the verified operational webhooks it gets; it
// answers fail for the first failFirst of them.
type opsReceiver struct {
	*httptest.Server
	failFirst int32
	calls     atomic.Int32
	mu        sync.Mutex
	hooks     []health.OpsWebhook
	headers   []http.Header
}

func newOpsReceiver(t *testing.T, failFirst int32) *opsReceiver {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	o := &opsReceiver{failFirst: failFirst}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.calls.Add(1) <= o.failFirst {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
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
		o.headers = append(o.headers, r.Header.Clone())
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

// A disable is applied at once on its replica and through the watch on
// the others, announced once (ops event and signed ops webhook, timed by
// the injected clock), and an enable clears it everywhere.
func TestDisableAnnouncesOnceAndEnableClears(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ops := newOpsReceiver(t, 0)
	reg := prometheus.NewRegistry()
	cfg := health.Config{OpsWebhookURL: ops.URL, OpsWebhookSecret: secret}
	r1 := b.start(t, "r1", cfg, health.Deps{Registerer: reg}, "orders")
	r2 := b.start(t, "r2", cfg, health.Deps{}, "orders")
	gauge := func() float64 {
		return promregtest.Value(t, reg, "jsbridge_consumer_endpoint_disabled", "subscription", "orders")
	}
	require.Zero(t, gauge())
	changed := r2.Changes()

	r1.Disable(b.ctx, health.DisabledRecord{Subscription: "orders", Endpoint: "https://hooks.example.com", Reason: health.ReasonGone, Status: http.StatusGone})
	require.True(t, r1.IsDisabled("orders"), "disabled at once on the replica that disables")
	require.Equal(t, 1.0, gauge())
	select {
	case <-changed:
	case <-time.After(wait):
		t.Fatal("r2's Changes not closed by the disable")
	}
	require.True(t, r2.IsDisabled("orders"), "the other replica follows the bucket")
	require.False(t, r2.IsDisabled("invoices"))
	// r2 disabling it again (its own 410) announces nothing more.
	r2.Disable(b.ctx, health.DisabledRecord{Subscription: "orders", Reason: health.ReasonGone})

	recs, err := health.ReadDisabled(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, health.ReasonGone, recs[0].Reason)
	require.Equal(t, "r1", recs[0].Replica)
	require.True(t, recs[0].At.Equal(b.clock.Now()), "the record's time is the injected clock's: %v", recs[0].At)

	r1.Wait()
	r2.Wait()
	hooks := ops.received()
	require.Len(t, hooks, 1, "one disable, one ops webhook")
	require.Equal(t, wire.OpsWebhookEndpointDisabled, hooks[0].Type)
	require.True(t, hooks[0].Timestamp.Equal(b.clock.Now()))
	require.Equal(t, "orders", hooks[0].Data.Subscription)
	require.Equal(t, http.StatusGone, hooks[0].Data.Status)
	s, err := b.js.Stream(b.ctx, wire.DefaultOpsStream)
	require.NoError(t, err)
	info, err := s.Info(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "one ops event")
	m, err := s.GetLastMsgForSubject(b.ctx, wire.SubjectEndpointDisabled)
	require.NoError(t, err)
	var ev health.DisabledRecord
	require.NoError(t, json.Unmarshal(m.Data, &ev))
	require.Equal(t, "r1", ev.Replica)

	waited := make(chan error, 1)
	go func() { waited <- r2.WaitEnabled(b.ctx, "orders") }()
	was, err := health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.True(t, was)
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("WaitEnabled did not return after Enable")
	}
	require.Eventually(t, func() bool { return !r1.IsDisabled("orders") }, wait, 5*time.Millisecond)
	// The gauge is set just after the state, outside its lock.
	require.Eventually(t, func() bool { return gauge() == 0 }, wait, 5*time.Millisecond, "jsbridge_consumer_endpoint_disabled back to 0")
}

// The sustained-failure rule on the injected clock: DisableMinFailures
// failures and DisableAfter since the first one; a success starts over;
// a negative DisableAfter never disables.
func TestFailedCallsForDisablingAfterDisableAfter(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	s, err := health.New(health.Config{DisableAfter: time.Hour, DisableMinFailures: 3}, health.Deps{Archetype: base.New(clock, nil, "")}, []string{"orders"})
	require.NoError(t, err)
	require.False(t, s.Failed("orders"))
	clock.Advance(time.Hour)
	require.False(t, s.Failed("orders"), "an hour, two failures: too few")
	require.True(t, s.Failed("orders"), "an hour since the first of three failures")
	require.False(t, s.Failed("invoices"), "streaks are per subscription")

	s.Succeeded("orders")
	for range 5 {
		require.False(t, s.Failed("orders"), "a success started the streak over")
	}
	clock.Advance(time.Hour - time.Nanosecond)
	require.False(t, s.Failed("orders"))
	clock.Advance(time.Nanosecond)
	require.True(t, s.Failed("orders"))

	never, err := health.New(health.Config{DisableAfter: -1, DisableMinFailures: 1}, health.Deps{Archetype: base.New(clock, nil, "")}, nil)
	require.NoError(t, err)
	require.False(t, never.Failed("orders"))
	clock.Advance(1000 * time.Hour)
	require.False(t, never.Failed("orders"))
}

// A streak's start is shared through the bucket: a replica started
// later (a restart) measures DisableAfter from the first replica's start
// once it counted DisableMinFailures of its own; a success deletes the
// key, and Forget does for a removed subscription.
func TestStreakSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := health.Config{DisableAfter: time.Hour, DisableMinFailures: 3}
	r1 := b.start(t, "r1", cfg, health.Deps{}, "orders")
	started := b.clock.Now()
	for range 3 {
		require.False(t, r1.Failed("orders"))
	}
	require.Eventually(t, func() bool { _, ok := b.streak(t, "orders"); return ok }, wait, 5*time.Millisecond, "streak written at DisableMinFailures")
	since, _ := b.streak(t, "orders")
	require.True(t, since.Equal(started))

	b.clock.Advance(time.Hour)
	r2 := b.start(t, "r2", cfg, health.Deps{}, "orders")
	// r2's watch has the key once Load and the first watch round are in;
	// its own first two failures are below DisableMinFailures either way.
	require.False(t, r2.Failed("orders"))
	require.False(t, r2.Failed("orders"))
	require.Eventually(t, func() bool { return r2.Failed("orders") }, wait, 5*time.Millisecond,
		"an hour since the shared start: disabling called for without another hour")

	r2.Succeeded("orders")
	require.Eventually(t, func() bool { _, ok := b.streak(t, "orders"); return !ok }, wait, 5*time.Millisecond, "a success deletes the key")
	// r1 saw the delete: its streak started over.
	require.Eventually(t, func() bool {
		return !r1.Failed("orders") && !r1.Failed("orders") && !r1.Failed("orders")
	}, wait, 5*time.Millisecond)

	// A removed subscription's key goes; a missing one is no error.
	require.Eventually(t, func() bool { _, ok := b.streak(t, "orders"); return ok }, wait, 5*time.Millisecond)
	require.NoError(t, r1.Forget(b.ctx, "orders"))
	_, ok := b.streak(t, "orders")
	require.False(t, ok)
	require.NoError(t, r1.Forget(b.ctx, "invoices"))
}

// observed records the shared breaker states a State hands on.
type observed struct {
	mu     sync.Mutex
	states []breaker.SharedState
}

func (o *observed) Observe(st breaker.SharedState, _ uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.states = append(o.states, st)
}

func (o *observed) last() (breaker.SharedState, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.states) == 0 {
		return breaker.SharedState{}, false
	}
	return o.states[len(o.states)-1], true
}

// The breaker store: nothing before the bucket is open, compare-and-swap
// on the key's revision after, and every replica's watch hands the states
// to its breakers.
func TestBreakerStoreSwapsAndShares(t *testing.T) {
	t.Parallel()
	b := setup(t)
	early, err := health.New(health.Config{}, health.Deps{JetStream: b.js, Archetype: base.New(b.clock, nil, "")}, nil)
	require.NoError(t, err)
	_, _, err = early.BreakerStore().Load(b.ctx, "https://hooks.example.com")
	require.Error(t, err, "the bucket is not open before Load or Start")

	var seen observed
	r1 := b.start(t, "r1", health.Config{}, health.Deps{}, "orders")
	b.start(t, "r2", health.Config{}, health.Deps{Breakers: &seen}, "orders")
	store := r1.BreakerStore()
	const ep = "https://hooks.example.com"
	st, rev, err := store.Load(b.ctx, ep)
	require.NoError(t, err)
	require.Zero(t, rev)
	require.Equal(t, breaker.SharedState{Endpoint: ep}, st)

	open := breaker.SharedState{Endpoint: ep, State: breaker.Open, Until: b.clock.Now().Add(time.Minute).UTC()}
	rev, err = store.Swap(b.ctx, open, 0)
	require.NoError(t, err)
	_, err = store.Swap(b.ctx, open, 0)
	require.ErrorIs(t, err, breaker.ErrConflict, "created meanwhile")
	_, err = store.Swap(b.ctx, open, rev+7)
	require.ErrorIs(t, err, breaker.ErrConflict, "a stale revision")
	got, gotRev, err := store.Load(b.ctx, ep)
	require.NoError(t, err)
	require.Equal(t, rev, gotRev)
	require.True(t, got.Until.Equal(open.Until))
	require.Equal(t, breaker.Open, got.State)

	require.Eventually(t, func() bool { s, ok := seen.last(); return ok && s.State == breaker.Open }, wait, 5*time.Millisecond,
		"the other replica's breakers get the state")
}

// The operator's side, without a running consumer: a missing bucket
// reads as nothing disabled, a disable keeps the first record, an enable
// says whether there was one.
func TestOperatorDisableEnableRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	recs, err := health.ReadDisabled(b.ctx, b.js)
	require.NoError(t, err)
	require.Empty(t, recs)
	was, err := health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.False(t, was, "no bucket: nothing to enable")

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	arch, later := base.New(clockwork.NewFakeClockAt(at), nil, ""), base.New(clockwork.NewFakeClockAt(at.Add(time.Hour)), nil, "")
	require.NoError(t, health.SetDisabled(b.ctx, arch, b.js, "orders", health.ReasonOperator))
	require.NoError(t, health.SetDisabled(b.ctx, later, b.js, "orders", "again"))
	require.NoError(t, health.SetDisabled(b.ctx, arch, b.js, "billing", health.ReasonOperator))
	recs, err = health.ReadDisabled(b.ctx, b.js)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, "billing", recs[0].Subscription, "by name")
	require.Equal(t, "orders", recs[1].Subscription)
	require.Equal(t, health.ReasonOperator, recs[1].Reason, "an existing record is kept")
	require.True(t, recs[1].At.Equal(at))

	was, err = health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.True(t, was)
	was, err = health.Enable(b.ctx, b.js, "orders")
	require.NoError(t, err)
	require.False(t, was, "enabled already")
}

// The ops webhook is retried after a pause on the injected clock, with
// the same idempotency key, until the receiver takes it.
func TestOpsWebhookRetriesOnTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ops := newOpsReceiver(t, 2)
	// No Load or Start: the disable is this replica's alone, and the only
	// timers on the clock are the webhook's pauses.
	s, err := health.New(health.Config{OpsWebhookURL: ops.URL, OpsWebhookSecret: secret},
		health.Deps{JetStream: b.js, Archetype: base.New(b.clock, nil, "r1")}, []string{"orders"})
	require.NoError(t, err)
	at := b.clock.Now()
	s.Disable(b.ctx, health.DisabledRecord{Subscription: "orders", Reason: health.ReasonGone})
	for try := 1; try <= 2; try++ {
		require.NoError(t, b.clock.BlockUntilContext(b.ctx, 1), "pause after failed try %d", try)
		require.EqualValues(t, try, ops.calls.Load())
		b.clock.Advance(time.Duration(try) * time.Second)
	}
	s.Wait()
	require.EqualValues(t, 3, ops.calls.Load())
	require.Len(t, ops.received(), 1)
	require.Equal(t, ops.headers[0].Get(wire.HeaderIdempotencyKey), "ops-orders-"+strconv.FormatInt(at.UnixNano(), 10))
}

// A nil State has every subscription enabled and counts nothing.
func TestNilStateIsEnabled(t *testing.T) {
	t.Parallel()
	var s *health.State
	require.False(t, s.IsDisabled("orders"))
	require.Nil(t, s.Changes())
	require.False(t, s.Failed("orders"))
	s.Succeeded("orders")
	s.Disable(context.Background(), health.DisabledRecord{Subscription: "orders"})
	s.Wait()
	require.NoError(t, s.WaitEnabled(context.Background(), "orders"))
}

// New refuses an ops webhook without a valid secret, naming the field.
func TestNewRefusesOpsWebhookWithoutSecret(t *testing.T) {
	t.Parallel()
	_, err := health.New(health.Config{OpsWebhookURL: "https://ops.example.com"}, health.Deps{}, nil)
	require.ErrorContains(t, err, "OpsWebhookSecret")
	_, err = health.New(health.Config{OpsWebhookURL: "https://ops.example.com", OpsWebhookSecret: "not-a-secret"}, health.Deps{}, nil)
	require.ErrorContains(t, err, "OpsWebhookSecret")
}
