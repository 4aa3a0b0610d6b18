package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
	"github.com/jsbridge/jsbridge/wire"
)

// Two consumer processes share one subscription; one is killed with
// SIGKILL while more than 1,000 deliveries are in flight. The receiver,
// deduplicating with the Postgres idempotency store, processes every event
// exactly once: the killed replica's messages come back from the
// partitions' records once its leases expired, and nothing is left to
// deliver.
func TestConsumerReplicaKilledMidDeliveryLosesNothing(t *testing.T) {
	t.Parallel()
	const (
		events   = 3000
		streams  = 1500 // deliveries of one stream run in order, so in-flight needs many streams
		inFlight = 1000
	)
	b := setupJetStream(t)
	pool := jsbridgetest.Pool(t)
	store, err := pgstore.New(pool, pgstore.WithTable(jsbridgetest.Schema(t, pool)+".webhook_idempotency"))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{testSecret})
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		processed = map[string]int{}
		running   atomic.Int32
		release   = make(chan struct{}) // closed once the replica is killed
		once      sync.Once
	)
	h := webhook.Handler(v, store, time.Hour, func(ctx context.Context, r *http.Request, _ []byte) error {
		running.Add(1)
		defer running.Add(-1)
		// Hold the work until the kill, so that many deliveries are in
		// flight; a request whose sender died is abandoned (its key released).
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
		}
		mu.Lock()
		processed[r.Header.Get(wire.HeaderIdempotencyKey)]++
		mu.Unlock()
		return nil
	}, webhook.WithLease(10*time.Second), webhook.WithLogger(slog.New(slog.DiscardHandler)))
	rsrv := httptest.NewServer(h)
	t.Cleanup(rsrv.Close)
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	env := []string{"JSBRIDGE_SECRET=" + testSecret}
	// No breaker: POSTs held past their timeout until enough are in
	// flight would otherwise trip the failure ratio, and the breaker
	// states are shared, so one replica's trip would stop both.
	cfg := filepath.Join(t.TempDir(), "subscriptions.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `breaker: {consecutive_failures: 1000000, min_requests: 1000000}
subscriptions:
  - {name: replicated, filter_subjects: [events.>], url: %q, ordering: none, max_in_flight: 700, max_ack_pending: 3000, secrets_env: [JSBRIDGE_SECRET], allow_private: true, start: all, max_deliver: -1, backoff: [200ms], timeout: 3500ms}
`, rsrv.URL), 0o600))
	args := []string{"run", "--nats-url", b.srv.ClientURL(), "-c", cfg, "--ops-addr", "", "--log-level", "warn"}
	victim := startProc(t, env, "consumer", args...)
	startProc(t, env, "consumer", args...)

	ids := b.publish(t, 1, events, streams)
	if !waitFor(60*time.Second, func() bool { return running.Load() >= inFlight }) {
		t.Fatalf("only %d deliveries in flight; replica output:\n%s", running.Load(), victim.out.String())
	}
	atKill := running.Load()
	victim.kill(t)
	t.Logf("killed one replica with %d deliveries in flight at the receiver (%d left after its connections closed)", atKill, running.Load())
	once.Do(func() { close(release) })

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(processed) == events
	}, 3*time.Minute, 100*time.Millisecond, "every event processed")
	// Nothing left to deliver: every partition's record settled up to
	// its last event, nothing in retry, no cursor.
	b.waitSettled(t, lastByPartition(1, events, streams, consumer.DefaultPartitions), time.Minute)

	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, processed[id], "event %s processed %d times", id, processed[id])
	}
}
