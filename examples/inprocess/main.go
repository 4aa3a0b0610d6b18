// Command inprocess runs the bridge inside an application's own process,
// with package bridge: it connects to the Postgres of DATABASE_URL (e.g.
// `DATABASE_URL=$(scripts/pg start)`, which starts the throwaway server and
// prints its URL; `scripts/pg url` only prints it), starts an embedded
// JetStream server,
// starts the bridge beside its own work, appends a few events and prints
// them as they arrive from JetStream, then stops the bridge gracefully.
//
//	DATABASE_URL=$(scripts/pg start) go run ./examples/inprocess
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/store"
)

// schema keeps the example's tables apart from the demo's and the bridge's.
const schema = "jsbridge_inprocess"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "inprocess:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is empty: give a Postgres URL, e.g. DATABASE_URL=$(scripts/pg start)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	dir, err := os.MkdirTemp("", "jsbridge-inprocess-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	// The embedding: New, Start, and Stop at the end.
	b, err := bridge.New(pool, js, bridge.Config{Schema: schema, Migrate: true, PollInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := b.Stop(stopCtx); err != nil {
			fmt.Fprintln(os.Stderr, "inprocess: stop:", err)
		}
	}()

	// The application's work: append events in its own store...
	st, err := store.New(pool, store.WithSchema(schema))
	if err != nil {
		return err
	}
	stream := fmt.Sprintf("order-%d", time.Now().UnixNano())
	names := []string{"OrderPlaced", "OrderPaid", "OrderShipped"}
	for v, name := range names {
		data := fmt.Appendf(nil, `{"step":%d}`, v+1)
		if _, err := st.Append(ctx, stream, int64(v-1), store.NewEvent{Name: name, Data: data}); err != nil {
			return err
		}
	}
	// ...and watch them arrive in JetStream, in order.
	cons, err := js.OrderedConsumer(ctx, bridge.DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for range names {
		msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			return fmt.Errorf("waiting for events from JetStream: %w", err)
		}
		fmt.Printf("%s %s\n", msg.Subject(), msg.Data())
	}
	return nil
}
