package unordered_test

import (
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/egress"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("unordered-test-secret-0123456789"))

// bundle is one test's JetStream (with the EVENTS stream) and context.
type bundle struct {
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	return bundle{js: js, ctx: ctx}
}

// publish publishes event id of stream order-1 as the bridge does.
func (b bundle) publish(t *testing.T, id int) {
	t.Helper()
	sid := strconv.Itoa(id)
	h := nats.Header{
		wire.HeaderMsgID: {sid}, wire.HeaderID: {sid}, wire.HeaderType: {"OrderPlaced"}, wire.HeaderSubject: {"order-1"},
		wire.HeaderSource: {"jsbridge"}, wire.HeaderSpecVersion: {"1.0"}, wire.HeaderContentType: {"application/json"},
		wire.HeaderStreamVersion: {sid},
	}
	_, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: "events.order.order-1.OrderPlaced", Header: h, Data: []byte(`{}`)})
	require.NoError(t, err)
}

// enabled is a Health whose subscriptions are always enabled.
type enabled struct{}

func (enabled) WaitEnabled(context.Context, string) error { return nil }
func (enabled) IsDisabled(string) bool                    { return false }
func (enabled) Changes() <-chan struct{}                  { return nil }

// metrics are fresh, unregistered collectors.
func metrics(name string) unordered.Metrics {
	return unordered.Metrics{
		Deliveries:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deliveries"}, []string{"subscription", "outcome", "status_class"}),
		InFlight:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "in_flight_" + name}),
		Redeliveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "redeliveries_" + name}),
		DeadLetters:  prometheus.NewCounter(prometheus.CounterOpts{Name: "dead_letters_" + name}),
	}
}

// run builds a Runner of s (a replica of its own: its own breaker and
// attempts) writing dead letters to dlq (nil: none), runs it and stops it
// at cleanup.
func (b bundle) run(t *testing.T, s subscription.Subscription, dlq deadletter.Writer) {
	t.Helper()
	s = s.WithDefaults()
	require.NoError(t, s.Validate())
	set, err := breaker.NewSet(breaker.Settings{}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	br := set.Breaker(s.URL)
	signer, err := webhook.NewSigner(s.Scheme, s.Secrets...)
	require.NoError(t, err)
	m := metrics(s.Name)
	snd, err := attempt.New(attempt.Config{Subscription: s, Signer: signer, Client: egress.NoRedirects(nil), UserAgent: "unordered-test"},
		attempt.Deps{Breaker: br, Metrics: attempt.Metrics{Deliveries: m.Deliveries}})
	require.NoError(t, err)
	r, err := unordered.New(unordered.Config{Subscription: s, Stream: "EVENTS"},
		unordered.Deps{JetStream: b.js, Sender: snd, Breaker: br, Health: enabled{}, Metrics: m, DeadLetters: dlq})
	require.NoError(t, err)
	require.NoError(t, r.Provision(b.ctx))
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

func (b bundle) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	cons, err := b.js.Consumer(b.ctx, "EVENTS", "orders")
	require.NoError(t, err)
	info, err := cons.Info(b.ctx)
	require.NoError(t, err)
	return info
}

// ordering none delivers one stream's events in parallel, up to the
// in-flight limit: MaxInFlight in one process, MaxAckPending across the
// replicas (issue 33). The receiver holds every request until the test
// has seen the limit's worth of one stream in flight at once (a stream
// delivered one event at a time never gets there) and, with one replica,
// events pulled beyond it waiting unsent; it never sees more than the
// limit at once, and each event once.
func TestOneStreamInParallelUpToTheInFlightLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		replicas      int
		maxInFlight   int
		maxAckPending int // 0: the default
		limit         int // the most in flight at once
	}{
		{"one replica, MaxInFlight", 1, 4, 0, 4},
		{"two replicas, MaxAckPending", 2, 4, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var (
				mu        sync.Mutex
				cur, peak int
				seen      = map[string]int{}
			)
			release := make(chan struct{})
			rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				cur++
				peak = max(peak, cur)
				seen[r.Header.Get(webhook.HeaderWebhookID)]++
				mu.Unlock()
				<-release
				mu.Lock()
				cur--
				mu.Unlock()
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(rc.Close)
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			t.Cleanup(open) // before the receiver closes: no handler stays blocked
			s := subscription.Subscription{
				Name: "orders", URL: rc.URL, FilterSubjects: []string{"events.order.>"}, Secrets: []string{secret}, AllowPrivate: true,
				Ordering: subscription.OrderingNone, Start: subscription.Start{Policy: subscription.StartAll},
				MaxInFlight: tc.maxInFlight, MaxAckPending: tc.maxAckPending,
			}
			for range tc.replicas {
				b.run(t, s, nil)
			}
			const n = 12
			for i := range n {
				b.publish(t, i+1)
			}
			inFlight := func() int {
				mu.Lock()
				defer mu.Unlock()
				return cur
			}
			require.Eventually(t, func() bool { return inFlight() == tc.limit }, 10*time.Second, 5*time.Millisecond,
				"%d webhooks of one stream in flight at once", tc.limit)
			if tc.replicas == 1 {
				// The process holds events it could send (its pull buffer)
				// and does not: the limit is what stops it.
				require.Eventually(t, func() bool { return b.info(t).NumAckPending > tc.limit }, 10*time.Second, 5*time.Millisecond,
					"events pulled beyond the in-flight limit")
			}
			require.Equal(t, tc.limit, inFlight(), "in flight while events wait")
			open()
			require.Eventually(t, func() bool {
				info := b.info(t)
				return info.AckFloor.Stream == n && info.NumAckPending == 0
			}, 10*time.Second, 10*time.Millisecond, "every event acked")
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, tc.limit, peak, "never more than the limit in flight")
			require.Len(t, seen, n)
			for id, c := range seen {
				require.Equal(t, 1, c, "event %s sent once", id)
			}
			require.Zero(t, b.info(t).NumRedelivered)
		})
	}
}

// letters is a dead-letter writer that keeps what it is given.
type letters struct {
	mu  sync.Mutex
	got []deadletter.Letter
}

func (l *letters) DeadLetter(_ context.Context, dl deadletter.Letter) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, dl)
	return nil
}

func (l *letters) all() []deadletter.Letter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]deadletter.Letter(nil), l.got...)
}

// A permanent failure dead-letters its event and Terms it; the stream is
// not held: ordering none parks nothing (OnDeadLetter is an ordered
// subscription's), so its later events are delivered and acked.
func TestDeadLetterHoldsNothingBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	delivered := map[string]bool{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(webhook.HeaderWebhookID)
		if id == "1" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		delivered[id] = true
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	dlq := &letters{}
	b.run(t, subscription.Subscription{
		Name: "orders", URL: rc.URL, FilterSubjects: []string{"events.order.>"}, Secrets: []string{secret}, AllowPrivate: true,
		Ordering: subscription.OrderingNone, Start: subscription.Start{Policy: subscription.StartAll},
	}, dlq)
	const n = 5
	for i := range n {
		b.publish(t, i+1)
	}
	require.Eventually(t, func() bool {
		info := b.info(t)
		return info.AckFloor.Stream == n && info.NumAckPending == 0
	}, 10*time.Second, 10*time.Millisecond, "every event acked or terminated")
	got := dlq.all()
	require.Len(t, got, 1)
	require.Equal(t, "1", got[0].EventID)
	require.Equal(t, http.StatusBadRequest, got[0].Status)
	require.Equal(t, "orders", got[0].Subscription)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]bool{"2": true, "3": true, "4": true, "5": true}, delivered)
}

// New names what is missing.
func TestNewNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	s := subscription.Subscription{Name: "orders", URL: "https://example.com/hook"}.WithDefaults()
	_, err := unordered.New(unordered.Config{Subscription: s}, unordered.Deps{})
	require.ErrorIs(t, err, unordered.ErrInvalidConfig)
	require.ErrorContains(t, err, `subscription "orders": Config.Stream is missing`)
	_, err = unordered.New(unordered.Config{Subscription: s, Stream: "EVENTS"}, unordered.Deps{})
	require.ErrorContains(t, err, "Deps.JetStream is missing")

	b := setup(t)
	br, err := breaker.NewSet(breaker.Settings{}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	s.MaxInFlight = 0
	_, err = unordered.New(unordered.Config{Subscription: s, Stream: "EVENTS"}, unordered.Deps{
		JetStream: b.js, Sender: (*attempt.Sender)(nil), Breaker: br.Breaker(s.URL), Health: enabled{}, Metrics: metrics("orders"),
	})
	require.ErrorIs(t, err, unordered.ErrInvalidConfig)
	require.ErrorContains(t, err, "Subscription.MaxInFlight 0: want at least 1")
}
