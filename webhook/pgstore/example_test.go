package pgstore_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
)

// A receiver whose effects live in the same Postgres as its records: the
// order gate's transaction holds the stream's position, the
// Idempotency-Key's record and the handler's writes, and commits them
// together, so each event's effect is applied exactly once, in order, over
// one connection per request.
func ExampleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	orders, err := pgstore.NewOrderStore(pool)
	if err != nil {
		log.Fatal(err)
	}
	keys, err := pgstore.New(pool) // the same pool: the claim joins the transaction
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range []interface{ Migrate(context.Context) error }{orders, keys} {
		if err := m.Migrate(ctx); err != nil {
			log.Fatal(err)
		}
	}
	verifier, err := webhook.NewVerifier(webhook.SchemeStandard, []string{os.Getenv("WEBHOOK_SECRET")})
	if err != nil {
		log.Fatal(err)
	}
	next := func(ctx context.Context, r *http.Request, body []byte) error {
		tx, ok := pgstore.Tx(ctx)
		if !ok {
			return &webhook.StatusError{Status: http.StatusBadRequest, Err: errors.New("not an ordered delivery")}
		}
		ce, err := webhook.DecodeCloudEvent(r, body)
		if err != nil {
			return &webhook.StatusError{Status: http.StatusUnprocessableEntity, Err: err}
		}
		_, err = tx.Exec(ctx, `INSERT INTO shipments (order_id, event_id) VALUES ($1, $2)`, ce.Subject, ce.ID)
		return err // nil commits it with the position and the key; an error rolls all back
	}
	gate := webhook.NewOrderGate(orders, webhook.WithGateRequireHeaders())
	http.Handle("/webhooks/orders", webhook.Handler(verifier, keys, 70*time.Minute, next, webhook.WithOrderGate(gate)))
}
