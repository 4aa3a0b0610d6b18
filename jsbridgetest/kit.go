// Package jsbridgetest is the test kit for applications that use jsbridge,
// as rivertest is River's: real parts, started in the test's process and
// torn down at its cleanup.
//
//   - Start runs the whole path against the caller's Postgres: a fresh
//     schema, an embedded JetStream server, the bridge and the consumer
//     in-process, and a recording webhook Receiver as the endpoint.
//   - Receiver verifies signatures with package webhook and records the
//     deliveries; WaitFor and RequireStream wait for them.
//   - Pool, Schema, DatabaseURL give a test its own Postgres schema;
//     StartJetStream, Connect and Stored an embedded JetStream server and
//     what it holds.
//
// An application's integration test of "append → my endpoint receives it,
// signed" is:
//
//	kit := jsbridgetest.Start(t, jsbridgetest.Config{})
//	ids := kit.Append(t, "order-42",
//		store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total":42}`)},
//		store.NewEvent{Name: "OrderPaid", Data: []byte(`{}`)})
//	for i, d := range kit.Receiver.RequireStream(t, "order-42", ids...) {
//		require.Equal(t, ids[i], d.IdempotencyKey)
//	}
//
// Postgres comes from $JSBRIDGE_TEST_DATABASE_URL (see DatabaseURL); the
// user needs the right to create schemas. Nothing is mocked, and nothing
// skips: what cannot be had fails the test, saying why.
package jsbridgetest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// DefaultSubscription is the name of the subscription Start creates when
// Config.Consumer has none: every event, to the Receiver.
const DefaultSubscription = "jsbridgetest"

// Config configures Start. The zero value runs everything with test
// defaults.
type Config struct {
	// Pool is the Postgres the bridge drains; the schema is created in it.
	// Default: Pool(t), on DatabaseURL.
	Pool *pgxpool.Pool
	// Bridge configures the bridge. Schema defaults to a fresh schema
	// (Schema), dropped at cleanup; Migrate is always on; PollInterval
	// defaults to 100 ms and Logger to a discarding one. Other fields take
	// the bridge's defaults.
	Bridge bridge.Config
	// Consumer configures the consumer. With no Subscriptions it gets one,
	// DefaultSubscription, of every event to the Receiver, with start
	// all (consumer.StartAll: every event the fresh events stream holds,
	// also those forwarded before the consumer started). Subscriptions
	// given keep their Start (zero: new, the events stored after the
	// consumer started, which Start waits for). A subscription
	// without URL is pointed at the Receiver (with AllowPrivate), and one
	// without Secrets takes the Receiver's scheme and secrets; a zero
	// BackOff becomes 100 ms (tests do not wait minutes for a retry).
	// Logger defaults to a discarding one, StartupTimeout to 1 min.
	Consumer consumer.Config
	// Receiver configures the recording endpoint.
	Receiver ReceiverConfig
	// JetStream configures the embedded server (see StartJetStream).
	JetStream embedded.Config
}

// Kit is a running bridge and consumer on one schema and one embedded
// JetStream server, with the Receiver as their endpoint.
type Kit struct {
	// Pool is the Postgres pool; Schema the test's schema in it.
	Pool   *pgxpool.Pool
	Schema string
	// Store appends events to the schema the bridge drains.
	Store *store.Store
	// Server is the embedded JetStream server; NATS and JetStream a
	// connection to it.
	Server    *embedded.Server
	NATS      *nats.Conn
	JetStream jetstream.JetStream
	// Bridge and Consumer are started; they stop at cleanup.
	Bridge   *bridge.Bridge
	Consumer *consumer.Consumer
	// Receiver records what the consumer delivers.
	Receiver *Receiver
}

// Start starts the kit and stops it at the test's cleanup (consumer, then
// bridge, then JetStream, then the schema is dropped). It returns when the
// schema is migrated, the JetStream stream and the durable consumers
// exist; it fails the test when a part does not start (a bad Config
// included).
func Start(t testing.TB, cfg Config) *Kit {
	t.Helper()
	// The parts run until their Stop at cleanup: Start's context must
	// not end before (the consumer's waiting is bounded by its
	// StartupTimeout, the bridge does not wait).
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	k := &Kit{Pool: cfg.Pool}
	if k.Pool == nil {
		k.Pool = Pool(t)
	}
	bc := cfg.Bridge
	if bc.Schema == "" {
		bc.Schema = Schema(t, k.Pool)
	}
	k.Schema = bc.Schema
	bc.Migrate = true
	if bc.PollInterval == 0 {
		bc.PollInterval = 100 * time.Millisecond
	}
	if bc.Logger == nil {
		bc.Logger = quiet
	}
	opts := []store.Option{store.WithSchema(bc.Schema)}
	if bc.EventsTable != "" {
		opts = append(opts, store.WithEventsTable(bc.EventsTable))
	}
	st, err := store.New(k.Pool, opts...)
	if err != nil {
		t.Fatalf("jsbridgetest: store: %v", err)
	}
	k.Store = st

	k.Receiver = NewReceiver(t, cfg.Receiver)
	k.Server = StartJetStream(t, cfg.JetStream)
	k.NATS, k.JetStream = Connect(t, k.Server)

	k.Bridge, err = bridge.New(k.Pool, k.JetStream, bc)
	if err != nil {
		t.Fatalf("jsbridgetest: bridge: %v", err)
	}
	if err := k.Bridge.Start(ctx); err != nil {
		t.Fatalf("jsbridgetest: start bridge: %v", err)
	}
	t.Cleanup(func() { stop(t, "bridge", k.Bridge.Stop) })

	cc := cfg.Consumer
	cc.Stream = bc.Stream
	if cc.Logger == nil {
		cc.Logger = quiet
	}
	if cc.StartupTimeout == 0 {
		cc.StartupTimeout = time.Minute
	}
	cc.Subscriptions = k.subscriptions(cc.Subscriptions, k.Bridge.Config().SubjectPrefix)
	k.Consumer, err = consumer.New(k.JetStream, cc)
	if err != nil {
		t.Fatalf("jsbridgetest: consumer: %v", err)
	}
	if err := k.Consumer.Start(ctx); err != nil {
		t.Fatalf("jsbridgetest: start consumer: %v", err)
	}
	t.Cleanup(func() { stop(t, "consumer", k.Consumer.Stop) })
	return k
}

// subscriptions fills the kit's defaults into subs (see Config.Consumer).
func (k *Kit) subscriptions(subs []consumer.Subscription, prefix string) []consumer.Subscription {
	if len(subs) == 0 {
		subs = []consumer.Subscription{{Name: DefaultSubscription, FilterSubjects: []string{wire.All(prefix)},
			Start: consumer.Start{Policy: consumer.StartAll}}}
	}
	out := make([]consumer.Subscription, len(subs))
	for i, s := range subs {
		if s.URL == "" {
			s.URL, s.AllowPrivate = k.Receiver.URL(), true
		}
		if len(s.Secrets) == 0 {
			s.Scheme, s.Secrets = k.Receiver.Scheme(), k.Receiver.Secrets()
		}
		if len(s.BackOff) == 0 {
			s.BackOff = []time.Duration{100 * time.Millisecond}
		}
		out[i] = s
	}
	return out
}

// stop calls a part's Stop with a bound, reporting an error.
func stop(t testing.TB, what string, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f(ctx); err != nil {
		t.Errorf("jsbridgetest: stop %s: %v", what, err)
	}
}

// Append appends events to stream (expecting nothing about its version)
// and returns their event ids as they appear on the wire (ce-id,
// Nats-Msg-Id, Idempotency-Key), in order. It fails the test on an error.
func (k *Kit) Append(t testing.TB, stream string, events ...store.NewEvent) []string {
	t.Helper()
	evs, err := k.Store.Append(context.Background(), stream, store.AnyVersion, events...)
	if err != nil {
		t.Fatalf("jsbridgetest: append to %s: %v", stream, err)
	}
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = event.FormatID(e.ID)
	}
	return ids
}

// Stored returns the messages the bridge stored in its JetStream stream
// under subject filter ("" for all), in stream order (see Stored).
func (k *Kit) Stored(t testing.TB, filter string) []jetstream.Msg {
	t.Helper()
	return Stored(t, k.JetStream, k.Bridge.Config().Stream, filter)
}
