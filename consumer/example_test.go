package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/webhook"
)

// The consumer inside an application, beside the bridge: an event appended
// to Postgres reaches the application's own endpoint, a handler behind the
// webhook package's receiver middleware (signature verified, duplicates
// answered by Idempotency-Key).
func Example() {
	ctx := context.Background()
	databaseURL, natsURL, schema, cleanup := exampleDeps()
	defer cleanup()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	// The receiving side: what the endpoint's owner runs.
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	verifier, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	if err != nil {
		log.Fatal(err)
	}
	handled := make(chan string, 1)
	endpoint := httptest.NewServer(webhook.Handler(verifier, webhook.NewMemoryStore(0), 24*time.Hour,
		func(_ context.Context, r *http.Request, body []byte) error {
			ce, err := webhook.DecodeCloudEvent(r, body)
			if err != nil {
				return &webhook.StatusError{Status: http.StatusUnprocessableEntity, Err: err}
			}
			handled <- fmt.Sprintf("%s %s %s", ce.Type, ce.Subject, ce.Data)
			return nil
		}))
	defer endpoint.Close()

	b, err := bridge.New(pool, js, bridge.Config{Schema: schema, Migrate: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(context.Background())

	c, err := consumer.New(js, consumer.Config{Subscriptions: []consumer.Subscription{{
		Name:           "orders",
		FilterSubjects: []string{"events.order.>"},
		URL:            endpoint.URL,
		Secrets:        []string{secret},
		AllowPrivate:   true, // the example's endpoint is on loopback
		// Every event the stream holds, also those stored before the
		// subscription was created (the default, StartNew, only those after).
		Start: consumer.Start{Policy: consumer.StartAll},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil { // waits for the streams, creates the durable consumer
		log.Fatal(err)
	}
	defer c.Stop(context.Background()) // graceful, as on SIGTERM

	st, err := store.New(pool, store.WithSchema(schema))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Append(ctx, "order-42", store.NoStream, store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total":42}`)}); err != nil {
		log.Fatal(err)
	}
	select {
	case got := <-handled:
		fmt.Println(got)
	case <-time.After(30 * time.Second):
		log.Fatal("not delivered")
	}
	// Output: OrderPlaced order-42 {"total": 42}
}

// exampleDeps gives the example the test database (see jsbridgetest), a
// fresh schema name in it, and an embedded JetStream server; cleanup drops
// the schema and stops the server.
func exampleDeps() (databaseURL, natsURL, schema string, cleanup func()) {
	databaseURL, err := jsbridgetest.LookupDatabaseURL()
	if err != nil {
		log.Fatalf("no Postgres: set %s: %v", jsbridgetest.EnvDatabaseURL, err)
	}
	dir, err := os.MkdirTemp("", "jsbridge-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	if err != nil {
		log.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "example_" + hex.EncodeToString(b)
	return databaseURL, srv.ClientURL(), schema, func() {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		pool, err := pgxpool.New(context.Background(), databaseURL)
		if err == nil {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			pool.Close()
		}
	}
}
