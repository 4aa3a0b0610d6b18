package consumer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
)

// syncLog is a log of text lines safe for the consumer's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// A subscription of the Config that sets the deprecated AckWait is
// accepted, whatever its Timeout, and New warns once, naming the
// subscription and the field; one that does not, no warning.
func TestNewWarnsOfIgnoredAckWait(t *testing.T) {
	t.Parallel()
	var log syncLog
	withAckWait := sub("orders", "http://127.0.0.1:1/hook")
	withAckWait.Timeout, withAckWait.AckWait = 10*time.Second, 5*time.Second
	_, err := consumer.New(stubJS{}, consumer.Config{Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Subscriptions: []consumer.Subscription{withAckWait, sub("audit", "http://127.0.0.1:1/hook")}})
	require.NoError(t, err)
	require.Equal(t, 1, log.count("ack_wait is deprecated and ignored"), log.b.String())
	require.Equal(t, 1, log.count(`subscription=orders ack_wait=5s`), log.b.String())
}

// A subscriptions bucket document of an earlier release with ack_wait
// loads and runs; the consumer warns once that it is ignored.
func TestBucketDocumentWithAckWaitLoads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEvents(t)
	key, err := consumer.GenerateSecretsKey("k1")
	require.NoError(t, err)
	ring, err := consumer.ParseSecretsKeyring(key)
	require.NoError(t, err)
	store, err := consumer.OpenSubscriptionStore(b.ctx, b.js, consumer.SubscriptionStoreConfig{Keys: ring})
	require.NoError(t, err)
	rc := newOrderReceiver(t)
	_, err = store.Create(b.ctx, sharedSub("orders", rc.srv.URL, consumer.OrderingStream), false)
	require.NoError(t, err)
	// As an earlier release wrote it: with ack_wait.
	kv, err := b.js.KeyValue(b.ctx, consumer.DefaultSubscriptionsBucket)
	require.NoError(t, err)
	raw, err := kv.Get(b.ctx, "orders")
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw.Value(), &doc))
	doc["ack_wait"] = "30s"
	v, err := json.Marshal(doc)
	require.NoError(t, err)
	_, err = kv.Put(b.ctx, "orders", v)
	require.NoError(t, err)

	var log syncLog
	c, err := consumer.New(b.js, consumer.Config{SubscriptionStore: store, Partitions: 2, LeaseTTL: 2 * time.Second,
		ReplicaID: "replica-a", Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	require.NoError(t, c.Start(b.ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.publishN(t, 0, 5, 1)
	require.Eventually(t, func() bool { return rc.received("/orders") == 5 }, 20*time.Second, 10*time.Millisecond, "delivered")
	require.Equal(t, 1, log.count("ack_wait is deprecated and ignored"), "one warning")
	require.Equal(t, 1, log.count("ack_wait=30s"))
}
