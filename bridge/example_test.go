package bridge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// The bridge inside an application: the application's own pgx pool and
// JetStream context, a bridge started beside its work and stopped with it,
// and an event appended with package store arriving in JetStream.
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

	b, err := bridge.New(pool, js, bridge.Config{Schema: schema, Migrate: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(context.Background()) // graceful, as on SIGTERM

	st, err := store.New(pool, store.WithSchema(schema))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Append(ctx, "order-42", -1, store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total":42}`)}); err != nil {
		log.Fatal(err)
	}

	cons, err := js.OrderedConsumer(ctx, bridge.DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.Subject(), string(msg.Data()))
	// Output: events.order.order-42.OrderPlaced {"total": 42}
}

// exampleDeps gives the example the test database (see jsbridgetest),
// a fresh schema in it, and an embedded JetStream server; cleanup drops
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
