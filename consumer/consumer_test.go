package consumer_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("consumer-test-secret-0123456789"))

func sub(name, url string) consumer.Subscription {
	return consumer.Subscription{
		Name: name, FilterSubjects: []string{wire.All(wire.DefaultEventsPrefix)}, URL: url,
		Secrets: []string{secret}, AllowPrivate: true, BackOff: []time.Duration{50 * time.Millisecond},
		Start: consumer.Start{Policy: consumer.StartAll}, // events published before the start count too
	}
}

// Each bad field is named in New's error, with its value, and wraps
// ErrInvalidConfig; nothing touches the network (js is a stub).
func TestNewNamesEachBadField(t *testing.T) {
	t.Parallel()
	good := sub("orders", "http://127.0.0.1:1/hook")
	missingCA := filepath.Join(t.TempDir(), "missing-ca.pem")
	for _, c := range []struct {
		name string
		cfg  consumer.Config
		want []string
	}{
		{"no subscriptions", consumer.Config{}, []string{"Subscriptions: none given"}},
		{"subscription field", consumer.Config{Subscriptions: []consumer.Subscription{good, func() consumer.Subscription {
			s := sub("bad", "ftp://x")
			return s
		}()}}, []string{"Subscriptions[1]", `"bad"`, "URL", "ftp://x"}},
		{"subscription TLS file", consumer.Config{Subscriptions: []consumer.Subscription{func() consumer.Subscription {
			s := sub("tls", "https://127.0.0.1:1/")
			s.TLS = consumer.TLSFiles{CAFile: missingCA}
			return s
		}()}}, []string{"Subscriptions[0]", missingCA}},
		{"duplicate name", consumer.Config{Subscriptions: []consumer.Subscription{good, good}}, []string{"Subscriptions[1].Name", `"orders"`, "Subscriptions[0]"}},
		{"breaker", consumer.Config{Subscriptions: []consumer.Subscription{good}, Breaker: breaker.Settings{FailureRatio: 2}}, []string{"Breaker", "FailureRatio", "2"}},
		{"stream", consumer.Config{Subscriptions: []consumer.Subscription{good}, Stream: "EV.ENTS"}, []string{"Stream", `"EV.ENTS"`}},
		{"dlq stream", consumer.Config{Subscriptions: []consumer.Subscription{good}, DLQStream: "D*"}, []string{"DLQStream", `"D*"`}},
		{"dlq is the events stream", consumer.Config{Subscriptions: []consumer.Subscription{good}, DLQStream: "EVENTS"}, []string{"DLQStream", `"EVENTS"`}},
		{"replicas", consumer.Config{Subscriptions: []consumer.Subscription{good}, Replicas: -1}, []string{"Replicas", "-1"}},
		{"startup timeout", consumer.Config{Subscriptions: []consumer.Subscription{good}, StartupTimeout: -time.Second}, []string{"StartupTimeout", "-1s"}},
		{"rate limit", consumer.Config{Subscriptions: []consumer.Subscription{func() consumer.Subscription {
			s := sub("fast", "http://127.0.0.1:1/hook")
			s.RateLimit = -2.5
			return s
		}()}}, []string{"Subscriptions[0]", `"fast"`, "RateLimit", "-2.5"}},
		{"ops webhook without its secret", consumer.Config{Subscriptions: []consumer.Subscription{good},
			Health: consumer.HealthConfig{OpsWebhookURL: "https://ops.example/hook"}}, []string{"Health.OpsWebhookSecret", "Health.OpsWebhookURL"}},
		{"disable min failures", consumer.Config{Subscriptions: []consumer.Subscription{good},
			Health: consumer.HealthConfig{DisableMinFailures: -1}}, []string{"Health.DisableMinFailures", "-1"}},
		{"attempts record", consumer.Config{Subscriptions: []consumer.Subscription{good},
			Attempts: &consumer.AttemptsConfig{Record: "successes"}}, []string{"Attempts.Record", `"successes"`, `"failures"`, `"all"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := consumer.New(stubJS{}, c.cfg)
			require.ErrorIs(t, err, consumer.ErrInvalidConfig)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), secret)
			require.ErrorIs(t, c.cfg.Validate(), consumer.ErrInvalidConfig, "Validate agrees with New")
		})
	}
	_, err := consumer.New(nil, consumer.Config{Subscriptions: []consumer.Subscription{good}})
	require.ErrorIs(t, err, consumer.ErrInvalidConfig)
	c, err := consumer.New(stubJS{}, consumer.Config{Subscriptions: []consumer.Subscription{good}})
	require.NoError(t, err)
	cfg := c.Config()
	require.Equal(t, consumer.DefaultStream, cfg.Stream)
	require.Equal(t, consumer.DefaultDLQStream, cfg.DLQStream)
	require.Equal(t, consumer.DefaultReplicas, cfg.Replicas)
}

// stubJS is a JetStream that New only stores: New must not call it.
type stubJS struct{ jetstream.JetStream }

type bundle struct {
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	return bundle{js: js, ctx: ctx}
}

// createEvents creates the events stream as the bridge does (with
// AllowDirect, which the engine's cursors read with).
func (b bundle) createEvents(t *testing.T) {
	t.Helper()
	_, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
}

// publish publishes event id of stream as the bridge does (binary-mode
// CloudEvents headers, Nats-Msg-Id = id).
func (b bundle) publish(t *testing.T, id int64, stream string) {
	t.Helper()
	sid := event.FormatID(id)
	h := nats.Header{}
	h.Set(wire.HeaderMsgID, sid)
	h.Set(wire.HeaderSpecVersion, event.SpecVersion)
	h.Set(wire.HeaderID, sid)
	h.Set(wire.HeaderType, "OrderPlaced")
	h.Set(wire.HeaderSource, "test")
	h.Set(wire.HeaderSubject, wire.EncodeHeaderValue(stream))
	h.Set(wire.HeaderContentType, event.ContentTypeJSON)
	_, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, stream, "OrderPlaced"), Header: h, Data: []byte(`{}`)})
	require.NoError(t, err)
}

// receiver verifies each request's signature and sends the Idempotency-Key
// of the verified ones to got; hold, while not nil, delays the answer
// until it is closed.
func receiver(t *testing.T, hold chan struct{}) (*httptest.Server, chan string) {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	got := make(chan string, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if err := v.Verify(r.Header, body); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if hold != nil {
			<-hold
		}
		got <- r.Header.Get(wire.HeaderIdempotencyKey)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// Start waits for the bridge's events stream (Ready says so meanwhile),
// creates the DLQ stream and the durable consumer, then delivers signed.
func TestStartWaitsForTheEventsStreamThenDelivers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, got := receiver(t, nil)
	c, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("orders", srv.URL)}})
	require.NoError(t, err)
	require.ErrorContains(t, c.Ready(b.ctx), "not provisioned")

	started := make(chan error, 1)
	go func() { started <- c.Start(b.ctx) }()
	require.Eventually(t, func() bool {
		err := c.Ready(b.ctx)
		return err != nil && strings.Contains(err.Error(), "waiting for JetStream stream EVENTS")
	}, 20*time.Second, 20*time.Millisecond, "Ready names the missing events stream")
	b.createEvents(t)
	select {
	case err := <-started:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return after the events stream was created")
	}
	require.NoError(t, c.Ready(b.ctx))
	_, err = b.js.Stream(b.ctx, consumer.DefaultDLQStream)
	require.NoError(t, err, "Start created the DLQ stream")
	require.ErrorIs(t, c.Start(b.ctx), consumer.ErrAlreadyStarted)

	b.publish(t, 1, "order-1")
	select {
	case key := <-got:
		require.Equal(t, "1", key)
	case <-time.After(20 * time.Second):
		t.Fatal("event not delivered")
	}
	require.NoError(t, c.Stop(b.ctx))
	require.NoError(t, c.Stop(b.ctx), "a second Stop is harmless")
}

// Stop is SIGTERM's graceful stop: a POST in flight finishes and is
// settled before Stop returns, so the next replica does not send it
// again.
func TestStopLetsTheDeliveryInFlightFinishAndAcks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	hold := make(chan struct{})
	inner, got := receiver(t, hold)
	// The POST is in flight once it reached the receiver (the message
	// pending on the consumer may still wait in the client's buffer).
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		inner.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s := sub("slow", srv.URL)
	s.Ordering = consumer.OrderingNone
	c, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{s}})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	b.publish(t, 7, "order-7")
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the POST never reached the receiver")
	}

	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(b.ctx) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a POST was in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(hold)
	require.NoError(t, <-stopped)
	require.Equal(t, "7", <-got)

	// The next replica takes the partitions over from the positions
	// committed at the stop: the next event is its first POST.
	next, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{s}})
	require.NoError(t, err)
	require.NoError(t, next.Start(b.ctx))
	t.Cleanup(func() { _ = next.Stop(context.Background()) })
	b.publish(t, 8, "order-8")
	select {
	case key := <-got:
		require.Equal(t, "8", key, "event 7 was settled before Stop returned, not sent again")
	case <-time.After(20 * time.Second):
		t.Fatal("event 8 not delivered by the next replica")
	}
}

// StartupTimeout gives up waiting for the events stream, naming it; an
// existing DLQ stream that does not hold the dead-letter subjects fails
// at once (waiting cannot fix it).
func TestProvisionGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("x", "http://127.0.0.1:1/")}, StartupTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	err = c.Start(b.ctx)
	require.ErrorIs(t, err, consumer.ErrStartupTimeout)
	require.Contains(t, err.Error(), "JetStream stream EVENTS")
	require.Less(t, time.Since(start), 10*time.Second)

	_, err = b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	require.NoError(t, err)
	c, err = consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("y", "http://127.0.0.1:1/")}, DLQStream: "OTHER"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	err = c.Provision(ctx)
	require.ErrorIs(t, err, consumer.ErrDLQSubjects)
	require.NoError(t, ctx.Err(), "failed at once, without waiting")

	// A stop while waiting is a clean return of Run.
	c, err = consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("z", "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	ctx, cancel = context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	require.True(t, errors.Is(ctx.Err(), context.DeadlineExceeded))
}

// Stop while Start waits for the events stream ends the waiting: Stop
// returns at once and Start with an error wrapping context.Canceled.
func TestStopWhileStartWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("early", "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- c.Start(b.ctx) }()
	require.Eventually(t, func() bool {
		err := c.Ready(b.ctx)
		return err != nil && strings.Contains(err.Error(), "waiting for JetStream stream EVENTS")
	}, 20*time.Second, 20*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, c.Stop(stopCtx))
	select {
	case err := <-started:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("Start still waiting after Stop")
	}
	// A failed Start can be retried; this one finds the stream.
	b.createEvents(t)
	require.NoError(t, c.Start(b.ctx))
	require.NoError(t, c.Ready(b.ctx))
	require.NoError(t, c.Stop(b.ctx))
}

// The life cycle shared with bridge (internal/lifecycle): Stop before
// Start is a no-op, Stop ends a foreground Run, Run after it returns
// ErrAlreadyStarted, and a second Stop is harmless.
func TestLifeCycleStopBeforeStartAndStopEndsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	srv, _ := receiver(t, nil)
	c, err := consumer.New(b.js, consumer.Config{Subscriptions: []consumer.Subscription{sub("cycle", srv.URL)}})
	require.NoError(t, err)
	require.NoError(t, c.Stop(b.ctx), "Stop before Start")

	ran := make(chan error, 1)
	go func() { ran <- c.Run(b.ctx) }()
	require.Eventually(t, func() bool { return c.Ready(b.ctx) == nil }, 20*time.Second, 20*time.Millisecond, "Run provisioned")
	require.NoError(t, c.Stop(b.ctx))
	select {
	case err := <-ran:
		require.NoError(t, err, "Run ends cleanly on Stop")
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running after Stop")
	}
	require.ErrorIs(t, c.Run(b.ctx), consumer.ErrAlreadyStarted)
	require.ErrorIs(t, c.Start(b.ctx), consumer.ErrAlreadyStarted)
	require.NoError(t, c.Stop(b.ctx), "a second Stop is harmless")
}
