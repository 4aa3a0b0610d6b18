package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/idempotencytest"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

type bundle struct {
	pool  *pgxpool.Pool
	table string
}

// setup gives each test its own schema on the test Postgres.
func setup(t *testing.T) bundle {
	t.Helper()
	pool := jsbridgetest.Pool(t)
	return bundle{pool: pool, table: jsbridgetest.Schema(t, pool) + ".keys"}
}

func newStore(t *testing.T, b bundle, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(b.pool, append([]pgstore.Option{pgstore.WithTable(b.table)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

func (b bundle) rows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.table).Scan(&n))
	return n
}

func TestStore(t *testing.T) {
	t.Parallel()
	idempotencytest.Run(t, func(t *testing.T, now func() time.Time) webhook.IdempotencyStore {
		return newStore(t, setup(t), pgstore.WithClock(now))
	})
}

// TestStoreDatabaseClock: without WithClock, leases and TTLs run on the
// database's clock.
func TestStoreDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t, setup(t))
	c, err := s.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.Equal(t, webhook.ClaimWon, c.State)
	dup, err := s.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.Equal(t, webhook.ClaimInProgress, dup.State)
	require.Greater(t, dup.Remaining, time.Duration(0))
	require.LessOrEqual(t, dup.Remaining, time.Minute)

	require.NoError(t, s.Complete(ctx, c, time.Millisecond))
	require.Eventually(t, func() bool {
		c, err := s.Claim(ctx, "42", time.Minute)
		return err == nil && c.State == webhook.ClaimWon
	}, 10*time.Second, 5*time.Millisecond, "the done record expires on the database clock")
}

func TestStoreCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	clock := idempotencytest.NewClock(time.Unix(1_700_000_000, 0))
	s := newStore(t, b, pgstore.WithClock(clock.Now))

	for i := range 5 {
		c, err := s.Claim(ctx, fmt.Sprint("done-", i), time.Minute)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, c, time.Hour))
	}
	_, err := s.Claim(ctx, "crashed", time.Minute)
	require.NoError(t, err)
	long, err := s.Claim(ctx, "long", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, long, 3*time.Hour))

	n, err := s.Cleanup(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing has expired yet")
	require.Equal(t, 7, b.rows(t))

	clock.Advance(time.Hour)
	n, err = s.Cleanup(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), n, "five done records past their TTL and the crashed lease")
	require.Equal(t, 1, b.rows(t))
	c, err := s.Claim(ctx, "long", time.Minute)
	require.NoError(t, err)
	require.Equal(t, webhook.ClaimDone, c.State, "an unexpired record survives cleanup")
}

func TestStoreRunCleanup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	b := setup(t)
	s := newStore(t, b)
	c, err := s.Claim(ctx, "42", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, c, time.Millisecond))

	done := make(chan error, 1)
	go func() { done <- s.RunCleanup(ctx, 20*time.Millisecond) }()
	require.Eventually(t, func() bool { return b.rows(t) == 0 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.ErrorIs(t, s.RunCleanup(context.Background(), 0), pgstore.ErrInvalidOption)
}

// TestStoreConcurrentReplicas: stores on separate pools (as separate
// receiver replicas would have) agree on one winner per key.
func TestStoreConcurrentReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	newStore(t, b) // migrate
	const replicas, keys = 3, 30
	won := make([][]string, replicas)
	var wg sync.WaitGroup
	errs := make(chan error, replicas)
	for r := range replicas {
		s, err := pgstore.New(jsbridgetest.Pool(t), pgstore.WithTable(b.table))
		require.NoError(t, err)
		wg.Go(func() {
			for k := range keys {
				c, err := s.Claim(ctx, fmt.Sprint(k), time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if c.State == webhook.ClaimWon {
					won[r] = append(won[r], c.Key)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	seen := map[string]int{}
	for _, w := range won {
		for _, k := range w {
			seen[k]++
		}
	}
	require.Len(t, seen, keys)
	for k, n := range seen {
		require.Equal(t, 1, n, "key %s won by %d replicas", k, n)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	_, err := pgstore.New(nil)
	require.ErrorIs(t, err, pgstore.ErrInvalidOption)
	for _, name := range []string{"", "a..b", "a.b.c", ".x"} {
		_, err := pgstore.New(pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrInvalidOption, "table %q", name)
		require.ErrorContains(t, err, fmt.Sprintf("%q", name))
	}
	_, err = pgstore.New(pool, pgstore.WithClock(nil))
	require.ErrorIs(t, err, pgstore.ErrInvalidOption)
	_, err = pgstore.New(pool, pgstore.WithLogger(nil))
	require.ErrorIs(t, err, pgstore.ErrInvalidOption)
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := newStore(t, b)
	require.NoError(t, s.Migrate(context.Background()), "Migrate is idempotent")
	require.Contains(t, s.MigrationSQL(), "CREATE TABLE IF NOT EXISTS "+`"`)
}

// TestHandlerOverPostgres: the receiver middleware on the Postgres store runs
// next once per Idempotency-Key across two receiver replicas, and answers
// 500 when the store fails (here: its table was never created).
func TestHandlerOverPostgres(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	b := setup(t)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{secret})
	require.NoError(t, err)
	signer, err := webhook.NewSigner(webhook.SchemeStandard, secret)
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	next := func(context.Context, *http.Request, []byte) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return nil
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	quiet := webhook.WithLogger(slog.New(slog.DiscardHandler))
	replica := func(s webhook.IdempotencyStore) *httptest.Server {
		srv := httptest.NewServer(webhook.Handler(v, s, time.Hour, next, quiet))
		t.Cleanup(srv.Close)
		return srv
	}
	a, c := replica(newStore(t, b)), replica(newStore(t, b))
	unmigrated, err := pgstore.New(b.pool, pgstore.WithTable(b.table+"_missing"))
	require.NoError(t, err)
	broken := replica(unmigrated)

	post := func(srv *httptest.Server) (int, string) {
		body := []byte(`{"id":"42"}`)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(wire.HeaderIdempotencyKey, "42")
		signer.Sign(req.Header, "42", time.Now(), body)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(bytes.TrimSpace(got))
	}
	status, _ := post(a)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = post(c)
	require.Equal(t, http.StatusNoContent, status, "the other replica sees the key done")
	require.Equal(t, 1, count())

	status, body := post(broken)
	require.Equal(t, http.StatusInternalServerError, status, "a store failure is retried by the sender")
	require.Equal(t, "idempotency-store", body)
	require.Equal(t, 1, count())
}

func BenchmarkStoreClaimComplete(b *testing.B) {
	ctx := context.Background()
	pool := jsbridgetest.Pool(b)
	s, err := pgstore.New(pool, pgstore.WithTable(jsbridgetest.Schema(b, pool)+".keys"))
	require.NoError(b, err)
	require.NoError(b, s.Migrate(ctx))
	i := 0
	for b.Loop() {
		i++
		c, err := s.Claim(ctx, fmt.Sprint(i), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, c, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
