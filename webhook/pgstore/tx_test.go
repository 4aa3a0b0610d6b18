package pgstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

const txSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// txReceiver is a receiver whose records and effects share one Postgres
// pool: Handler verifying, an order gate over an OrderStore, a Store for
// the Idempotency-Key, and a handler that writes each event's effect (a
// row of schema.effects) in the request's transaction.
type txReceiver struct {
	http.Handler
	schema string
}

// migrateTx creates the receiver's tables in schema.
func migrateTx(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ctx := context.Background()
	order, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable(schema+".positions"))
	require.NoError(t, err)
	require.NoError(t, order.Migrate(ctx))
	keys, err := pgstore.New(pool, pgstore.WithTable(schema+".keys"))
	require.NoError(t, err)
	require.NoError(t, keys.Migrate(ctx))
	_, err = pool.Exec(ctx, `CREATE TABLE `+schema+`.effects (
	seq bigserial PRIMARY KEY, stream text NOT NULL, version bigint NOT NULL, event_id text NOT NULL)`)
	require.NoError(t, err)
}

// newTxReceiver builds the receiver over pool; hook, when set, runs inside
// the handler after the effect is written, before the commit.
func newTxReceiver(t testing.TB, pool *pgxpool.Pool, schema string, hook func(stream string, version int64)) http.Handler {
	t.Helper()
	order, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable(schema+".positions"))
	require.NoError(t, err)
	keys, err := pgstore.New(pool, pgstore.WithTable(schema+".keys"))
	require.NoError(t, err)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{txSecret})
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	gate := webhook.NewOrderGate(order, webhook.WithGateLogger(quiet), webhook.WithGateRequireHeaders())
	return webhook.Handler(v, keys, time.Hour, func(ctx context.Context, r *http.Request, body []byte) error {
		tx, ok := pgstore.Tx(ctx)
		if !ok {
			return errors.New("no transaction in the request context")
		}
		ce, err := webhook.DecodeCloudEvent(r, body)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (stream, version, event_id) VALUES ($1, $2, $3)`,
			ce.Subject, ce.StreamVersion, ce.ID); err != nil {
			return err
		}
		if hook != nil {
			hook(ce.Subject, ce.StreamVersion)
		}
		return nil
	}, webhook.WithOrderGate(gate), webhook.WithLogger(quiet))
}

// chainedRequest returns version v of stream (after v-1) as a signed,
// structured, ordered webhook from partition 0 at epoch 1.
func chainedRequest(t testing.TB, url, stream string, v int64) *http.Request {
	t.Helper()
	id := fmt.Sprintf("%s@%d", stream, v)
	body := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/shop","type":"Happened","subject":%q,"streamversion":%d,"data":{}}`, id, stream, v)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(wire.HeaderContentType, event.ContentTypeCloudEventsJSON)
	req.Header.Set(wire.HeaderIdempotencyKey, id)
	signer, err := webhook.NewSigner(webhook.SchemeStandard, txSecret)
	require.NoError(t, err)
	now := time.Now()
	signer.Sign(req.Header, id, now, body)
	signer.SignOrder(req.Header, id, now, webhook.OrderFields{Stream: stream, Version: v, Previous: v - 1, Partition: 0, Epoch: 1})
	return req
}

// effects returns each stream's effects in the order they were committed.
func effects(t testing.TB, pool *pgxpool.Pool, schema string) map[string][]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT stream, version FROM `+schema+`.effects ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var s string
		var v int64
		require.NoError(t, rows.Scan(&s, &v))
		out[s] = append(out[s], v)
	}
	require.NoError(t, rows.Err())
	return out
}

func upTo(n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i)
	}
	return out
}

// TestOneTransactionPoolBelowConcurrency: with MaxConns 2 and 16 senders
// at once, on distinct streams and on shared ones, every event is
// processed once and in order, and no request waits for a second
// connection. Before, the gate's transaction held one connection and the
// idempotency claim waited for another: this test's requests waited
// until the client's 10 s timeout.
func TestOneTransactionPoolBelowConcurrency(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(jsbridgetest.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	schema := jsbridgetest.Schema(t, pool)
	migrateTx(t, pool, schema)
	srv := httptest.NewServer(newTxReceiver(t, pool, schema, nil))
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 10 * time.Second}

	const senders, versions = 16, 8
	// send delivers stream's versions in order, as a sender does: each
	// until a 2xx, again after a 409 or 503.
	send := func(stream string) error {
		for v := range int64(versions) {
			for attempt := 0; ; attempt++ {
				if attempt > 2000 {
					return fmt.Errorf("%s v%d: no 2xx after %d attempts", stream, v, attempt)
				}
				resp, err := client.Do(chainedRequest(t, srv.URL, stream, v))
				if err != nil {
					return fmt.Errorf("%s v%d: %w", stream, v, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					break
				}
				if resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusServiceUnavailable {
					return fmt.Errorf("%s v%d: %d %q", stream, v, resp.StatusCode, b)
				}
				runtime.Gosched() // retry at once, as the hammer does
			}
		}
		return nil
	}
	for _, c := range []struct {
		name    string
		streams int
	}{{"distinct", senders}, {"shared", 2}} {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, senders)
		for i := range senders {
			stream := fmt.Sprintf("%s-%d", c.name, i%c.streams)
			wg.Go(func() {
				if err := send(stream); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, c.name)
		}
		got := effects(t, pool, schema)
		for i := range c.streams {
			require.Equal(t, upTo(versions), got[fmt.Sprintf("%s-%d", c.name, i)], "%s: each version's effect once, in order", c.name)
		}
		t.Logf("%s: %d senders on %d streams, %d versions each, MaxConns 2: %v", c.name, senders, c.streams, versions, time.Since(start).Round(time.Millisecond))
	}
	var pending int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.keys WHERE NOT done`).Scan(&pending))
	require.Zero(t, pending, "every Idempotency-Key committed done with its effect")
}

// TestOneTransactionRollsBackWithTheHandler: a handler that fails after
// writing leaves neither its effect, nor the key, nor the position; the
// retry applies the effect once.
func TestOneTransactionRollsBackWithTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schema, _, _ := strings.Cut(b.table, ".")
	migrateTx(t, b.pool, schema)
	fail := true
	var mu sync.Mutex
	h := newTxReceiver(t, b.pool, schema, func(string, int64) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			fail = false
			panic("handler fails after its write")
		}
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if recover() != nil {
				http.Error(w, "panicked", http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Do(chainedRequest(t, srv.URL, "order-1", 0))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.Empty(t, effects(t, b.pool, schema), "the failed handler's write rolled back")
	var keys int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.keys`).Scan(&keys))
	require.Zero(t, keys, "and its claim")
	for range 2 {
		resp, err = srv.Client().Do(chainedRequest(t, srv.URL, "order-1", 0))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
	}
	require.Equal(t, map[string][]int64{"order-1": {0}}, effects(t, b.pool, schema))
}

// Environment of the killed-receiver test's child process.
const (
	childEnv       = "PGSTORE_TEST_CHILD_SCHEMA"
	childBlockEnv  = "PGSTORE_TEST_CHILD_BLOCK"  // "v<n>": block inside the handler of version n, after its write
	childAnswerEnv = "PGSTORE_TEST_CHILD_ANSWER" // "v<n>": block after version n committed, before its answer
)

// TestReceiverKilledMidHandler kills (SIGKILL) a receiver process twice:
// inside the handler of v3 after it wrote its effect, and after v6 was
// committed but before its answer left. The sender retries each through a
// new receiver process. Every version's effect is applied once, in order:
// the first kill rolled v3's transaction back, the second kill's retry
// finds v6 recorded and is answered as a duplicate.
func TestReceiverKilledMidHandler(t *testing.T) {
	if schema := os.Getenv(childEnv); schema != "" {
		runChildReceiver(t, schema)
		return
	}
	if testing.Short() {
		t.Skip("starts receiver processes")
	}
	t.Parallel()
	b := setup(t)
	schema, _, _ := strings.Cut(b.table, ".")
	migrateTx(t, b.pool, schema)

	type child struct {
		cmd   *exec.Cmd
		url   string
		lines chan string
	}
	start := func(env ...string) *child {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReceiverKilledMidHandler$", "-test.v")
		cmd.Env = append(os.Environ(), append(env, childEnv+"="+schema)...)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		c := &child{cmd: cmd, lines: make(chan string, 16)}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				c.lines <- sc.Text()
			}
			close(c.lines)
		}()
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		for line := range c.lines {
			if u, ok := strings.CutPrefix(line, "listening "); ok {
				c.url = u
				return c
			}
		}
		t.Fatal("the child receiver exited before listening")
		return nil
	}
	// waitFor returns once the child prints want (it is then blocked).
	waitFor := func(c *child, want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case line, ok := <-c.lines:
				require.True(t, ok, "the child exited before %q", want)
				if line == want {
					return
				}
			case <-timeout:
				t.Fatalf("the child never printed %q", want)
			}
		}
	}
	kill := func(c *child) {
		require.NoError(t, c.cmd.Process.Kill())
		_ = c.cmd.Wait()
	}
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(url string, v int64) (*http.Response, error) {
		resp, err := client.Do(chainedRequest(t, url, "order-1", v))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp, nil
	}
	// deliver posts v until a 2xx, retrying 409 and 503 (a row still held
	// by a dead receiver's session until Postgres notices) in place.
	// It returns the 2xx's Jsbridge-Order ("duplicate", or "" when the
	// version was processed).
	deliver := func(url string, v int64) (order string) {
		require.Eventually(t, func() bool {
			resp, err := post(url, v)
			require.NoError(t, err)
			order = resp.Header.Get(wire.HeaderOrder)
			return resp.StatusCode/100 == 2
		}, 30*time.Second, 5*time.Millisecond, "v%d", v)
		return order
	}

	c := start(childBlockEnv+"=v3", childAnswerEnv+"=v6")
	for v := range int64(3) {
		require.Empty(t, deliver(c.url, v))
	}
	// v3: killed inside the handler, after its write.
	failed := make(chan error, 1)
	go func() { _, err := post(c.url, 3); failed <- err }()
	waitFor(c, "blocked in handler v3")
	kill(c)
	require.Error(t, <-failed, "the sender saw no answer")
	require.Equal(t, upTo(3), effects(t, b.pool, schema)["order-1"], "v3's write died with its transaction")

	c = start(childAnswerEnv + "=v6")
	for v := int64(3); v < 6; v++ {
		require.Empty(t, deliver(c.url, v), "v%d processed", v)
	}
	// v6: killed after its commit, before its answer.
	go func() { _, err := post(c.url, 6); failed <- err }()
	waitFor(c, "blocked before answering v6")
	kill(c)
	require.Error(t, <-failed, "the sender saw no answer")
	require.Equal(t, upTo(7), effects(t, b.pool, schema)["order-1"], "v6 committed")

	c = start()
	require.Equal(t, wire.OrderDuplicate, deliver(c.url, 6), "v6's retry finds it recorded")
	for v := int64(7); v < 10; v++ {
		require.Empty(t, deliver(c.url, v), "v%d processed", v)
	}
	require.Equal(t, upTo(10), effects(t, b.pool, schema)["order-1"], "every effect once, in order")
}

// runChildReceiver is the killed-receiver test's child: it serves the
// receiver on a loopback port, prints "listening <url>", and blocks where
// the environment says, printing what it blocks in, until it is killed.
func runChildReceiver(t *testing.T, schema string) {
	pool := jsbridgetest.Pool(t)
	block, answer := os.Getenv(childBlockEnv), os.Getenv(childAnswerEnv)
	h := newTxReceiver(t, pool, schema, func(_ string, v int64) {
		if block == "v"+strconv.FormatInt(v, 10) {
			fmt.Printf("blocked in handler v%d\n", v)
			select {}
		}
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&blockingWriter{ResponseWriter: w, version: r, answer: answer}, r)
	}))
	fmt.Printf("listening %s\n", srv.URL)
	select {}
}

// blockingWriter blocks, before the status leaves, the answer of the
// version its answer names: the order gate has committed by then.
type blockingWriter struct {
	http.ResponseWriter
	version *http.Request
	answer  string
}

func (w *blockingWriter) WriteHeader(code int) {
	if w.answer != "" && code/100 == 2 {
		if id := w.version.Header.Get(wire.HeaderIdempotencyKey); strings.HasSuffix(id, "@"+strings.TrimPrefix(w.answer, "v")) {
			fmt.Printf("blocked before answering %s\n", w.answer)
			select {}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}
