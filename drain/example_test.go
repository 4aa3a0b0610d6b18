package drain_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/store"
)

// Wiring a drain to the Postgres store, as cmd/bridge does: the store is
// both the drain's Store and its Notifier, and the handler forwards each
// batch (here it only logs).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	s, err := store.New(pool) // schema "jsbridge"
	if err != nil {
		panic(err)
	}
	if err := s.Migrate(ctx); err != nil {
		panic(err)
	}
	forward := drain.HandlerFunc(func(ctx context.Context, batches []drain.Batch) []drain.Result {
		out := make([]drain.Result, len(batches))
		for i, b := range batches {
			for _, e := range b.Events {
				slog.Info("forward", "stream", e.Stream, "event_id", e.ID)
			}
			out[i] = drain.Result{Done: len(b.Events)}
		}
		return out
	})
	d, err := drain.New(s, forward, drain.Config{Lease: time.Minute, Notifier: s})
	if err != nil {
		panic(err)
	}
	_ = d.Run(ctx) // until ctx is done
}
