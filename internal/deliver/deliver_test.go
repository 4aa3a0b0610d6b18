package deliver_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("deliver-test-secret-0123456789"))

type bundle struct {
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	return bundle{js: js, ctx: ctx}
}

// publish publishes an event as the bridge does: subject per stream,
// Nats-Msg-Id and CloudEvents binary-mode headers, data as the body.
func (b bundle) publish(t *testing.T, id int64, stream, name, data string) {
	t.Helper()
	b.publishWith(t, id, stream, name, data, nats.Header{})
}

// publishWith is publish with more headers in h.
func (b bundle) publishWith(t *testing.T, id int64, stream, name, data string, h nats.Header) {
	t.Helper()
	sid := event.FormatID(id)
	h[wire.HeaderMsgID] = []string{sid}
	h[wire.HeaderSpecVersion] = []string{event.SpecVersion}
	h[wire.HeaderID] = []string{sid}
	h[wire.HeaderType] = []string{wire.EncodeHeaderValue(name)}
	h[wire.HeaderSource] = []string{"/jsbridge/test"}
	h[wire.HeaderSubject] = []string{wire.EncodeHeaderValue(stream)}
	h[wire.HeaderTime] = []string{"2026-01-02T03:04:05.123456789Z"}
	h[wire.HeaderContentType] = []string{event.ContentTypeJSON}
	h[wire.HeaderStreamVersion] = []string{"7"}
	h[wire.HeaderCorrelationID] = []string{"corr-1"}
	h[wire.HeaderCausationID] = []string{"cause-1"}
	token := func(s string) string { return strings.NewReplacer(" ", "%20", ".", "%2E").Replace(s) }
	subject := "events." + token(wire.Category(stream)) + "." + token(stream) + "." + token(name)
	_, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(data)})
	require.NoError(t, err)
}

// run starts a consumer and stops it at cleanup, requiring a clean return.
// The function it returns cancels the consumer's context and returns at
// once: the consumer may still be finishing what it had in hand (see
// runStopped).
func (b bundle) run(t *testing.T, cfg deliver.Config, subs ...subscription.Subscription) context.CancelFunc {
	t.Helper()
	cancel, _ := b.start(t, cfg, subs...)
	return cancel
}

// runStopped is run whose returned function also waits for the
// consumer's Run to return (20 s at most, an error otherwise): after it,
// nothing of that consumer sends, counts or writes any more.
func (b bundle) runStopped(t *testing.T, cfg deliver.Config, subs ...subscription.Subscription) func() {
	t.Helper()
	cancel, wait := b.start(t, cfg, subs...)
	return func() {
		cancel()
		wait()
	}
}

// start starts a consumer; it returns its cancel and a wait for its Run's
// return (once, then at once), which cleanup calls too.
func (b bundle) start(t *testing.T, cfg deliver.Config, subs ...subscription.Subscription) (context.CancelFunc, func()) {
	t.Helper()
	c, err := deliver.New(b.js, cfg, subs...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// Run creates the durable consumers in its goroutine: wait for them,
	// so a test's first look at one (info) does not race its creation.
	for _, s := range subs {
		require.Eventually(t, func() bool {
			_, err := b.js.Consumer(b.ctx, "EVENTS", s.Name)
			return err == nil
		}, 10*time.Second, 5*time.Millisecond, "durable consumer %q created", s.Name)
	}
	var once sync.Once
	wait := func() {
		once.Do(func() {
			select {
			case err := <-done:
				assert.NoError(t, err, "Run's return")
			case <-time.After(20 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		wait()
	})
	return cancel, wait
}

func (b bundle) info(t *testing.T, name string) *jetstream.ConsumerInfo {
	t.Helper()
	cons, err := b.js.Consumer(b.ctx, "EVENTS", name)
	require.NoError(t, err)
	info, err := cons.Info(b.ctx)
	require.NoError(t, err)
	return info
}

// request is one request a receiver got.
type request struct {
	at     time.Time
	path   string
	header http.Header
	body   []byte
}

// receiver is an httptest server answering with respond(n) for its n-th
// request (0-based) and recording every request.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []request
}

func newReceiver(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		n := len(rc.reqs)
		rc.reqs = append(rc.reqs, request{at: time.Now(), path: r.URL.Path, header: r.Header.Clone(), body: body})
		rc.mu.Unlock()
		respond(n, w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func status(code int) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.reqs...)
}

func (rc *receiver) count() int { return len(rc.requests()) }

func (rc *receiver) waitFor(t *testing.T, n int) []request {
	t.Helper()
	require.Eventually(t, func() bool { return rc.count() >= n }, 15*time.Second, 10*time.Millisecond, "want %d requests", n)
	return rc.requests()
}

func sub(name, url string) subscription.Subscription {
	return subscription.Subscription{
		Name:           name,
		FilterSubjects: []string{"events.order.>"},
		URL:            url,
		Secrets:        []string{secret},
		BackOff:        []time.Duration{50 * time.Millisecond},
		AllowPrivate:   true, // httptest listens on loopback
		// These tests are about the unordered engine (one durable consumer
		// on EVENTS, Nak with delay); ordered_test.go tests the default.
		Ordering: subscription.OrderingNone,
		// They publish before or while the consumer starts and expect
		// every event: start all (start_test.go tests the others).
		Start: subscription.Start{Policy: subscription.StartAll},
	}
}

func requireSettled(t *testing.T, b bundle, name string, n uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		cons, err := b.js.Consumer(b.ctx, "EVENTS", name)
		if err != nil {
			return false
		}
		info, err := cons.Info(b.ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == n && info.NumPending == 0
	}, 10*time.Second, 20*time.Millisecond, "consumer %s: every message acked or terminated", name)
}

func TestStructuredDeliveryAcks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusNoContent))
	s := sub("orders", rc.URL+"/hook")
	s.Headers = map[string]string{"Authorization": "Bearer t0ken"}
	b.run(t, deliver.Config{}, s)

	data := `{"total": 42, "note": "a<b & c>d",  "items": [1, 2]}`
	b.publish(t, 42, "order-7", "OrderPlaced", data)

	got := rc.waitFor(t, 1)[0]
	requireSettled(t, b, "orders", 1)
	require.Equal(t, "/hook", got.path)
	require.Equal(t, "42", got.header.Get("Idempotency-Key"))
	require.Equal(t, event.ContentTypeCloudEventsJSON, got.header.Get("Content-Type"))
	require.Equal(t, "Bearer t0ken", got.header.Get("Authorization"))
	require.Regexp(t, `^jsbridge/`, got.header.Get("User-Agent"))

	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	require.NoError(t, v.Verify(got.header, got.body))
	require.Equal(t, "42", got.header.Get(webhook.HeaderWebhookID))

	var ce event.CloudEvent
	require.NoError(t, json.Unmarshal(got.body, &ce))
	require.Equal(t, data, string(ce.Data), "data byte for byte")
	require.Equal(t, event.CloudEvent{
		SpecVersion: "1.0", ID: "42", Source: "/jsbridge/test", Type: "OrderPlaced", Subject: "order-7",
		Time: "2026-01-02T03:04:05.123456789Z", DataContentType: event.ContentTypeJSON, StreamVersion: 7,
		CorrelationID: "corr-1", CausationID: "cause-1", Data: ce.Data,
	}, ce)

	// Delivered once, never again.
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 1, rc.count())
}

func TestStructuredDeliveryDecodesHeaderValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusNoContent))
	b.run(t, deliver.Config{}, sub("odd", rc.URL))

	b.publish(t, 9, "order-9 b", "Order Placed", `{}`)
	got := rc.waitFor(t, 1)[0]
	var ce event.CloudEvent
	require.NoError(t, json.Unmarshal(got.body, &ce))
	require.Equal(t, "order-9 b", ce.Subject, "percent-encoded header decoded in the envelope")
	require.Equal(t, "Order Placed", ce.Type)
}

func TestBinaryDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	s := sub("orders-bin", rc.URL)
	s.Body = subscription.BodyBinary
	s.Scheme = webhook.SchemeHMACSHA256
	s.Secrets = []string{"plain-hmac-secret"}
	b.run(t, deliver.Config{}, s)

	data := `{"a": [1,  2]}`
	b.publish(t, 5, "order-1", "OrderShipped", data)
	got := rc.waitFor(t, 1)[0]
	requireSettled(t, b, "orders-bin", 1)

	require.Equal(t, data, string(got.body))
	require.Equal(t, event.ContentTypeJSON, got.header.Get("Content-Type"))
	require.Equal(t, "5", got.header.Get("Idempotency-Key"))
	for k, want := range map[string]string{
		wire.HeaderID: "5", wire.HeaderSpecVersion: "1.0", wire.HeaderType: "OrderShipped",
		wire.HeaderSource: "/jsbridge/test", wire.HeaderSubject: "order-1", wire.HeaderTime: "2026-01-02T03:04:05.123456789Z",
		wire.HeaderStreamVersion: "7", wire.HeaderCorrelationID: "corr-1", wire.HeaderCausationID: "cause-1",
	} {
		require.Equal(t, want, got.header.Get(k), k)
	}
	v, err := webhook.NewVerifier(webhook.SchemeHMACSHA256, []string{"plain-hmac-secret"})
	require.NoError(t, err)
	require.NoError(t, v.Verify(got.header, got.body))
	require.Empty(t, got.header.Get(webhook.HeaderWebhookSignature), "hmac-sha256 scheme sends no Standard Webhooks signature")
}

// deadLetters records dead letters.
type deadLetters struct {
	mu  sync.Mutex
	got []deadletter.Letter
}

func (d *deadLetters) DeadLetter(_ context.Context, dl deadletter.Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, dl)
	return nil
}

func (d *deadLetters) list() []deadletter.Letter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]deadletter.Letter(nil), d.got...)
}

func TestPermanent4xxIsTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusUnprocessableEntity))
	dl := &deadLetters{}
	reg := prometheus.NewRegistry()
	b.run(t, deliver.Config{DeadLetters: dl, Registerer: reg}, sub("orders", rc.URL))

	b.publish(t, 9, "order-3", "OrderPlaced", `{}`)
	rc.waitFor(t, 1)
	requireSettled(t, b, "orders", 1)
	// BackOff is 50 ms: a retry would have come by now.
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, rc.count(), "a permanent failure is not retried")
	info := b.info(t, "orders")
	require.Zero(t, info.NumRedelivered)
	require.Zero(t, info.NumAckPending)

	got := dl.list()
	require.Len(t, got, 1)
	require.Equal(t, "orders", got[0].Subscription)
	require.Equal(t, "9", got[0].EventID)
	require.Equal(t, 1, got[0].Attempt)
	require.Equal(t, http.StatusUnprocessableEntity, got[0].Status)
	require.Equal(t, `{}`, string(got[0].Msg.Data()))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jsbridge_consumer_deliveries_total Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).
# TYPE jsbridge_consumer_deliveries_total counter
jsbridge_consumer_deliveries_total{outcome="term",status_class="4xx",subscription="orders"} 1
`), "jsbridge_consumer_deliveries_total"))
}

func TestFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc1 := newReceiver(t, status(http.StatusOK))
	rc2 := newReceiver(t, status(http.StatusOK))
	b.run(t, deliver.Config{}, sub("a", rc1.URL), sub("b", rc2.URL))
	for id := int64(1); id <= 3; id++ {
		b.publish(t, id, "order-"+strconv.FormatInt(id, 10), "OrderPlaced", `{}`)
	}
	b.publish(t, 4, "user-1", "UserCreated", `{}`) // not matched by the filter

	for _, rc := range []*receiver{rc1, rc2} {
		got := rc.waitFor(t, 3)
		ids := map[string]bool{}
		for _, r := range got {
			ids[r.header.Get("Idempotency-Key")] = true
		}
		require.Equal(t, map[string]bool{"1": true, "2": true, "3": true}, ids)
	}
	requireSettled(t, b, "a", 3)
	requireSettled(t, b, "b", 3)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 3, rc1.count())
	require.Equal(t, 3, rc2.count())
}

func TestBreakerStopsRequestsWhileOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusServiceUnavailable))
	reg := prometheus.NewRegistry()
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: 1500 * time.Millisecond}, nil, reg)
	require.NoError(t, err)
	s := sub("orders", rc.URL)
	s.MaxInFlight = 1
	s.BackOff = []time.Duration{10 * time.Millisecond}
	b.run(t, deliver.Config{Breakers: set}, s)
	for id := int64(1); id <= 5; id++ {
		b.publish(t, id, "order-1", "OrderPlaced", `{}`)
	}

	// Read from the receiver's timestamps, not from sleeps: a loaded
	// machine can only stretch the gaps, never shorten them, whereas a
	// fixed sleep it stretched past the open timeout would see a probe.
	rc.waitFor(t, 2)
	require.Eventually(t, func() bool { return breakerTripped(t, reg, rc.URL) }, 30*time.Second, 5*time.Millisecond,
		"the breaker opened after 2 failures")
	// Open: nothing reaches the endpoint until the open timeout elapses;
	// half-open: one probe, which fails and re-opens it for another open
	// timeout before the next probe.
	got := rc.waitFor(t, 4)
	require.GreaterOrEqual(t, got[2].at.Sub(got[1].at), 1400*time.Millisecond, "no requests while the breaker is open")
	require.GreaterOrEqual(t, got[3].at.Sub(got[2].at), 1400*time.Millisecond, "one probe per half-open")
}

// breakerTripped reports whether the breaker of endpoint url went from
// closed to open, from its transitions counter in reg.
func breakerTripped(t *testing.T, reg *prometheus.Registry, url string) bool {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if f.GetName() == "jsbridge_consumer_breaker_transitions_total" && labels["endpoint"] == breaker.Endpoint(url) &&
				labels["from"] == "closed" && labels["to"] == "open" && m.GetCounter().GetValue() >= 1 {
				return true
			}
		}
	}
	return false
}

func TestShutdownFinishesInFlightDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	c, err := deliver.New(b.js, deliver.Config{}, sub("orders", rc.URL))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	b.publish(t, 1, "order-1", "OrderPlaced", `{}`)
	<-started
	cancel()
	require.NoError(t, <-done)
	// The ack is sent before Run returns; the server records it a moment
	// later (a plain ack is not confirmed).
	require.Eventually(t, func() bool { return b.info(t, "orders").AckFloor.Stream == 1 }, 5*time.Second, 10*time.Millisecond,
		"the in-flight delivery finished and was acked")
	require.Equal(t, 1, rc.count())
}

func TestNewRejectsDuplicateNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := deliver.New(b.js, deliver.Config{}, sub("x", "http://a.example"), sub("x", "http://b.example"))
	require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
	require.ErrorContains(t, err, `"x"`)
}

func TestRetriesExhaustedAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusBadGateway))
	dl := &deadLetters{}
	s := sub("orders", rc.URL)
	s.MaxDeliver = 3
	s.BackOff = []time.Duration{10 * time.Millisecond}
	b.run(t, deliver.Config{DeadLetters: dl}, s)
	b.publish(t, 77, "order-1", "OrderPlaced", `{}`)

	rc.waitFor(t, 3)
	requireSettled(t, b, "orders", 1)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 3, rc.count(), "MaxDeliver attempts, then no more")
	got := dl.list()
	require.Len(t, got, 1)
	require.Equal(t, "77", got[0].EventID)
	require.Equal(t, 3, got[0].Attempt)
	require.Equal(t, http.StatusBadGateway, got[0].Status)
	require.Contains(t, got[0].Reason, "MaxDeliver 3")
}

func TestConsumerConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	s := sub("orders", rc.URL)
	s.FilterSubjects = []string{"events.order.>", "events.*.*.UserCreated"}
	s.MaxInFlight = 8
	b.run(t, deliver.Config{}, s)
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(b.ctx, "EVENTS", "orders")
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	cfg := b.info(t, "orders").Config
	require.Equal(t, "orders", cfg.Durable)
	require.Equal(t, s.FilterSubjects, cfg.FilterSubjects)
	require.Equal(t, jetstream.AckExplicitPolicy, cfg.AckPolicy)
	require.Equal(t, subscription.DefaultAckWait, cfg.AckWait)
	require.Equal(t, -1, cfg.MaxDeliver, "MaxDeliver is enforced by the consumer, so a failed dead letter is retried")
	require.GreaterOrEqual(t, cfg.MaxAckPending, 8)
}
