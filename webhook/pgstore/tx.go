package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A gated request's transaction. OrderStore.Lock begins it and holds the
// stream's row in it; the order gate runs its handler with a request
// context carrying it (webhook.ContextOrderLock); a Store on the same pool
// claims and completes the Idempotency-Key in it; the receiver's handler
// finds it with Tx and writes its own effects in it; the gate's Advance
// records the stream's new position and commits it all at once. A
// receiver killed anywhere before that commit (a crash, a lost connection,
// a handler error) rolls every part of it back, so the sender's retry finds
// the event neither processed nor recorded: each event's effects are
// applied exactly once, in the stream's order, over one connection.

// requestTx is what the request context carries.
type requestTx struct {
	tx   pgx.Tx
	pool *pgxpool.Pool
}

type txKey struct{}

// Tx returns the transaction of the ordered request being processed, when
// a gate over an OrderStore holds its stream (Handler with WithOrderGate,
// or OrderGate.Middleware): ctx is the context the handler was given (a
// webhook.ProcessFunc's ctx, or r.Context() behind Middleware). Writes made
// in it commit together with the stream's position and, with a Store on
// the same pool, the Idempotency-Key's record, when the handler succeeds
// and the gate records the version; they roll back otherwise. The handler
// must not commit or roll it back, nor use it from several goroutines at
// once (pgx.Tx is not safe for concurrent use). ok is false for a request
// the gate does not hold: an unordered one passed through, or a gate over
// another store.
//
// Write in it only with a Store on the same pool as the idempotency
// store (Handler's, or your own deduplication's): a record kept outside
// the transaction stays done when the commit fails or the receiver dies
// before it, and the sender's retry is then answered as a duplicate while
// the handler's writes were rolled back, so they are lost.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	rt, ok := ctx.Value(txKey{}).(*requestTx)
	if !ok {
		return nil, false
	}
	return rt.tx, true
}

// querier is what Store's statements run on: the pool, or the request's
// transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// db returns the request's transaction when ctx carries one begun on s's
// pool, and the pool otherwise: a claim made in the gate's transaction
// needs no second connection, and commits or rolls back with the handler's
// effects.
func (s *Store) db(ctx context.Context) querier {
	if rt, ok := ctx.Value(txKey{}).(*requestTx); ok && rt.pool == s.pool {
		return rt.tx
	}
	return s.pool
}
