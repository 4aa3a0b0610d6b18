package integration

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

// orderedReceiver is a receiver built as a user would build one: package
// webhook's handler over the Postgres idempotency store (pgstore), without
// an order gate, so what it records is the order the senders kept. It
// records, in arrival order, the first POST of every event id (with the
// sender's replica, partition and lease epoch), how many POSTs each id
// got, and every event id its processing function ran for, in the order
// it ran, so the test can count redeliveries and what was processed twice
// and check each stream's order both as sent and as processed.
type orderedReceiver struct {
	name       string
	start      time.Time
	mu         sync.Mutex
	firstPosts []firstPost    // the first POST of each event id, in arrival order
	posts      map[string]int // event id -> POSTs received
	processed  []string       // event ids, in the order processed
	times      map[string]int // event id -> times processed
	refusals   map[string]int // a gated receiver's answers by Jsbridge-Order value
}

// firstPost is the first POST of one event id as the receiver saw it: when
// (since the receiver started) and from which sender.
type firstPost struct {
	id, replica, partition, epoch string
	at                            time.Duration
}

func newOrderedReceiver(t *testing.T, pool *pgxpool.Pool, schema, name string) (*orderedReceiver, *httptest.Server) {
	t.Helper()
	return newReceiver(t, pool, schema, name, false)
}

// newGatedReceiver is newOrderedReceiver behind an order gate kept in
// Postgres (package webhook's OrderGate over pgstore's order store, on the
// idempotency store's pool): the receiver proves each stream's order from
// the version chain instead of trusting it. One transaction holds the
// stream's position, the idempotency key and the event's effect (a row
// written through pgstore.Tx), and an event counts as processed only once
// that transaction committed, so processed twice or out of order can only
// come from the gate letting something through. It also counts the
// gate's refusals by Jsbridge-Order value.
func newGatedReceiver(t *testing.T, pool *pgxpool.Pool, schema, name string) (*orderedReceiver, *httptest.Server) {
	t.Helper()
	return newReceiver(t, pool, schema, name, true)
}

type ranKey struct{}

func newReceiver(t *testing.T, pool *pgxpool.Pool, schema, name string, gated bool) (*orderedReceiver, *httptest.Server) {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)
	if gated {
		pool = receiverPool(t)
	}
	idem, err := pgstore.New(pool, pgstore.WithTable(schema+"."+name+"_idempotency"))
	require.NoError(t, err)
	require.NoError(t, idem.Migrate(t.Context()))
	rc := &orderedReceiver{name: name, start: time.Now(), posts: map[string]int{}, times: map[string]int{}, refusals: map[string]int{}}
	var opts []webhook.HandlerOption
	effects := schema + "." + name + "_effects"
	if gated {
		orders, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable(schema+"."+name+"_order"))
		require.NoError(t, err)
		require.NoError(t, orders.Migrate(t.Context()))
		_, err = pool.Exec(t.Context(), "CREATE TABLE "+effects+" (seq bigserial PRIMARY KEY, event_id text NOT NULL)")
		require.NoError(t, err)
		opts = append(opts, webhook.WithOrderGate(webhook.NewOrderGate(orders, webhook.WithGateRequireHeaders(),
			// Refusals other than 409s (a malformed chain: 400) at Warn,
			// so a failed run's log names them.
			webhook.WithGateLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))))
	}
	record := func(id string) {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.processed = append(rc.processed, id)
		rc.times[id]++
	}
	h := webhook.Handler(v, idem, time.Hour, func(ctx context.Context, r *http.Request, _ []byte) error {
		id := r.Header.Get("Idempotency-Key")
		if !gated {
			record(id)
			return nil
		}
		tx, ok := pgstore.Tx(ctx)
		if !ok {
			return &webhook.StatusError{Status: http.StatusBadRequest, Err: errors.New("no order transaction: not an ordered delivery")}
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (event_id) VALUES ($1)", id); err != nil {
			return err
		}
		*ctx.Value(ranKey{}).(*bool) = true
		return nil
	}, opts...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.arrived(r)
		if !gated {
			h.ServeHTTP(w, r)
			return
		}
		ran := new(bool)
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), ranKey{}, ran)))
		// Handler answers 2xx only after the transaction holding the
		// effect, the key and the position committed.
		if *ran && sw.status/100 == 2 {
			record(r.Header.Get("Idempotency-Key"))
		}
		if o := w.Header().Get(wire.HeaderOrder); o != "" {
			rc.mu.Lock()
			rc.refusals[o]++
			rc.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	return rc, srv
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// gateAnswers returns the gate's answers other than processing, by
// Jsbridge-Order value (duplicate, gap, in-progress, stale-epoch).
func (rc *orderedReceiver) gateAnswers() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return maps.Clone(rc.refusals)
}

// arrived records a POST as it arrives, before the handler verifies it.
func (rc *orderedReceiver) arrived(r *http.Request) {
	id := r.Header.Get("Idempotency-Key")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.posts[id]++
	if rc.posts[id] == 1 {
		rc.firstPosts = append(rc.firstPosts, firstPost{
			id: id, at: time.Since(rc.start), replica: r.Header.Get(wire.HeaderReplica),
			partition: r.Header.Get(wire.HeaderPartition), epoch: r.Header.Get(wire.HeaderLeaseEpoch),
		})
	}
}

func (rc *orderedReceiver) distinct() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.times)
}

// receiverFigures count what a receiver got: events processed in all, more
// than once, and after a later version of their stream; POSTs received
// beyond the first of each event (redeliveries), and first POSTs that
// arrived after the first POST of a later version of their stream.
type receiverFigures struct{ processed, twice, outOfOrder, redelivered, firstPostInversions int }

// check counts, against versions (event id -> stream and version), the
// events processed more than once, those processed after a later version
// of their stream, the redelivered POSTs and the first-POST inversions (a
// first POST of version v arriving after the first POST of some v' > v of
// the same stream), logging each. With every event processed once, no
// out-of-order one means each stream was processed in version order; no
// first-POST inversion means the senders sent each stream in order. Every
// processed event must be one of versions. With logOrder false, the
// order's departures are counted, not logged one by one.
func (rc *orderedReceiver) check(t *testing.T, versions map[string]streamVersion, logOrder bool) receiverFigures {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	f := receiverFigures{processed: len(rc.processed)}
	for id, n := range rc.times {
		if n > 1 {
			f.twice++
			t.Logf("%s receiver: event %s processed %d times", rc.name, id, n)
		}
	}
	for _, n := range rc.posts {
		f.redelivered += n - 1
	}
	next := map[string]int64{}
	for _, id := range rc.processed {
		sv, ok := versions[id]
		require.True(t, ok, "the %s receiver processed event %s, which Postgres does not hold", rc.name, id)
		if sv.version < next[sv.stream] {
			f.outOfOrder++
			if !logOrder {
				continue
			}
			t.Logf("%s receiver: stream %s: version %d processed after version %d", rc.name, sv.stream, sv.version, next[sv.stream]-1)
		}
		next[sv.stream] = max(next[sv.stream], sv.version+1)
	}
	latest := map[string]firstPost{} // stream -> first POST of its highest version so far
	for _, p := range rc.firstPosts {
		sv, ok := versions[p.id]
		require.True(t, ok, "the %s receiver got a POST of event %s, which Postgres does not hold", rc.name, p.id)
		l, seen := latest[sv.stream]
		if seen && versions[l.id].version > sv.version {
			f.firstPostInversions++
			if !logOrder {
				continue
			}
			t.Logf("%s receiver: stream %s: first POST of version %d at %v (replica %s, partition %s, epoch %s) "+
				"after the first POST of version %d at %v (replica %s, partition %s, epoch %s)",
				rc.name, sv.stream, sv.version, p.at.Round(time.Millisecond), p.replica, p.partition, p.epoch,
				versions[l.id].version, l.at.Round(time.Millisecond), l.replica, l.partition, l.epoch)
			continue
		}
		latest[sv.stream] = p
	}
	return f
}

type streamVersion struct {
	stream  string
	version int64
}

// eventVersions maps every event id (as webhooks carry it) to its stream
// and version.
func eventVersions(t *testing.T, pool *pgxpool.Pool, schema string) map[string]streamVersion {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id, stream, version FROM "+schema+".events")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]streamVersion{}
	for rows.Next() {
		var id int64
		var sv streamVersion
		require.NoError(t, rows.Scan(&id, &sv.stream, &sv.version))
		out[event.FormatID(id)] = sv
	}
	require.NoError(t, rows.Err())
	return out
}

// receiverPool is a gated receiver's own pool of 32 connections. Its every
// request holds one connection for the transaction that keeps the stream's
// position (docs/receiver.md: size the pool to the requests processed at once);
// sharing the test's 8 with the writer and the other receivers starved it
// on a loaded machine: in a soak run at load 27 its requests queued for a
// connection past the sender's 2 s timeout, the endpoint's breaker opened
// and nothing was processed for 60 s.
func receiverPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
