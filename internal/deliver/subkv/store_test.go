package subkv_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/subkv"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("subkv-test-secret-0123456789"))

func keys(t *testing.T, ids ...string) *subkv.Keyring {
	t.Helper()
	var lines []string
	for _, id := range ids {
		l, err := subkv.GenerateKey(id)
		require.NoError(t, err)
		lines = append(lines, l)
	}
	k, err := subkv.ParseKeyring(strings.Join(lines, "\n"))
	require.NoError(t, err)
	return k
}

func sub(name string) subscription.Subscription {
	return subscription.Subscription{
		Name: name, FilterSubjects: []string{"events.order.>"}, URL: "https://hooks.example.com/in?token=abc",
		Secrets: []string{secret}, Headers: map[string]string{"Authorization": "Bearer xyz"}, Ordering: subscription.OrderingNone,
	}
}

func open(t *testing.T, k *subkv.Keyring) (*subkv.Store, context.Context, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	s, err := subkv.Open(ctx, js, subkv.Config{Keys: k})
	require.NoError(t, err)
	return s, ctx, js
}

func TestStoreSealsAndRoundTrips(t *testing.T) {
	t.Parallel()
	k := keys(t, "k1")
	s, ctx, _ := open(t, k)
	rev, err := s.Create(ctx, sub("orders"), false)
	require.NoError(t, err)
	e, err := s.Get(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision)
	require.Equal(t, sub("orders").Secrets, e.Subscription.Secrets)
	require.Equal(t, "https://hooks.example.com/in?token=abc", e.Subscription.URL)
	require.Equal(t, "Bearer xyz", e.Subscription.Headers["Authorization"])
	require.Equal(t, "k1", e.Document.Sealed.KeyID)

	// Nothing secret in the stored document in clear.
	raw := e.Document.Sealed.Data + e.Document.Endpoint + strings.Join(e.Document.HeaderNames, ",")
	for _, clear := range []string{secret, "token=abc", "Bearer"} {
		require.NotContains(t, raw, clear)
	}
}

func TestStoreRefusesInvalid(t *testing.T) {
	t.Parallel()
	s, ctx, _ := open(t, keys(t, "k1"))
	bad := sub("orders")
	bad.FilterSubjects = []string{"events..x"}
	_, err := s.Create(ctx, bad, false)
	require.ErrorIs(t, err, subscription.ErrInvalidSubscription)
	require.ErrorContains(t, err, "FilterSubjects[0]")
	require.ErrorContains(t, err, `"events..x"`)
	_, err = s.Get(ctx, "orders")
	require.ErrorIs(t, err, subkv.ErrNotFound)
}

func TestStoreConcurrentUpdatesConflict(t *testing.T) {
	t.Parallel()
	s, ctx, _ := open(t, keys(t, "k1"))
	rev, err := s.Create(ctx, sub("orders"), false)
	require.NoError(t, err)
	_, err = s.Create(ctx, sub("orders"), false)
	require.ErrorIs(t, err, subkv.ErrConflict)

	// Two operators read revision rev and write at once: one wins.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			u := sub("orders")
			u.MaxInFlight = 10 + i
			_, errs[i] = s.Update(ctx, u, false, rev)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		require.ErrorIs(t, err, subkv.ErrConflict)
		require.ErrorContains(t, err, "revision")
	}
	require.Equal(t, 1, won)
	e, err := s.Get(ctx, "orders")
	require.NoError(t, err)
	require.NoError(t, e.Subscription.Validate())
	require.Contains(t, []int{10, 11}, e.Subscription.MaxInFlight)
	require.Greater(t, e.Revision, rev)
}

func TestKeyringRotation(t *testing.T) {
	t.Parallel()
	l1, err := subkv.GenerateKey("old")
	require.NoError(t, err)
	l2, err := subkv.GenerateKey("new")
	require.NoError(t, err)
	oldRing, err := subkv.ParseKeyring(l1)
	require.NoError(t, err)
	both, err := subkv.ParseKeyring(l2 + "\n" + l1)
	require.NoError(t, err)
	newOnly, err := subkv.ParseKeyring(l2)
	require.NoError(t, err)

	s, ctx, _ := open(t, oldRing)
	_, err = s.Create(ctx, sub("orders"), false)
	require.NoError(t, err)

	// A replica given the new key first and the old one after reads it
	// and reseals it with the new key on the next write.
	sb := s.WithKeys(both)
	e, err := sb.Get(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, "old", e.Document.Sealed.KeyID)
	_, err = sb.Update(ctx, e.Subscription, e.Paused, e.Revision)
	require.NoError(t, err)
	e, err = s.WithKeys(newOnly).Get(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, "new", e.Document.Sealed.KeyID)
	require.Equal(t, sub("orders").Secrets, e.Subscription.Secrets)

	// The old key alone no longer opens it, and says why.
	_, err = s.Get(ctx, "orders")
	require.ErrorIs(t, err, subkv.ErrUnknownKey)

	// Without keys: redacted.
	e, err = s.WithKeys(nil).Get(ctx, "orders")
	require.NoError(t, err)
	require.True(t, e.Redacted)
	require.Empty(t, e.Subscription.Secrets)
	require.Equal(t, "https://hooks.example.com/in", e.Subscription.URL)
	_, err = s.WithKeys(nil).SetPaused(ctx, "orders", true, 0)
	require.NoError(t, err)
	e, err = s.WithKeys(newOnly).Get(ctx, "orders")
	require.NoError(t, err)
	require.True(t, e.Paused)
	require.Equal(t, sub("orders").Secrets, e.Subscription.Secrets)
	require.False(t, errors.Is(err, subkv.ErrConflict))
}

// Watch replays the bucket, marks the end of the replay, then sends each
// change in order; keys that are not subscription names are not
// subscriptions; a document this keyring cannot open comes with Err.
func TestWatchSendsChangesInOrder(t *testing.T) {
	t.Parallel()
	k := keys(t, "k1")
	s, ctx, js := open(t, k)
	_, err := s.Create(ctx, sub("before"), false)
	require.NoError(t, err)

	changes := make(chan subkv.Change, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Watch(wctx, func(c subkv.Change) { changes <- c }) }()
	next := func() subkv.Change {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-ctx.Done():
			t.Fatal("no change")
			return subkv.Change{}
		}
	}
	c := next()
	require.Equal(t, "before", c.Name)
	require.True(t, c.Initial)
	require.Equal(t, sub("before").Secrets, c.Entry.Subscription.Secrets)
	require.Equal(t, subkv.Change{Initial: true}, next(), "the end of the replay")

	kv, err := js.KeyValue(ctx, "jsbridge_subscriptions")
	require.NoError(t, err)
	_, err = kv.Put(ctx, "health.before", []byte(`{"open":true}`))
	require.NoError(t, err)
	rev, err := s.Create(ctx, sub("orders"), false)
	require.NoError(t, err)
	_, err = s.SetPaused(ctx, "orders", true, rev)
	require.NoError(t, err)
	_, err = s.WithKeys(keys(t, "other")).Create(ctx, sub("sealed-elsewhere"), false)
	require.NoError(t, err)
	require.NoError(t, s.Delete(ctx, "orders", 0))

	c = next()
	require.Equal(t, "orders", c.Name)
	require.False(t, c.Entry.Paused)
	c = next()
	require.Equal(t, "orders", c.Name)
	require.True(t, c.Entry.Paused)
	c = next()
	require.Equal(t, "sealed-elsewhere", c.Name)
	require.ErrorIs(t, c.Err, subkv.ErrUnknownKey)
	c = next()
	require.Equal(t, "orders", c.Name)
	require.True(t, c.Deleted)

	list, err := s.WithKeys(nil).List(ctx)
	require.NoError(t, err)
	var names []string
	for _, e := range list {
		names = append(names, e.Subscription.Name)
	}
	require.Equal(t, []string{"before", "sealed-elsewhere"}, names, "health.before is not a subscription")
	cancel()
	require.NoError(t, <-done)
}

// ack_wait is deprecated: a subscription's AckWait is not written, and a
// document of an earlier release that has it (even one that does not
// parse) still loads, its value handed on for the consumer's warning.
func TestStoreAckWaitReadNotWritten(t *testing.T) {
	t.Parallel()
	s, ctx, js := open(t, keys(t, "k1"))
	withAckWait := sub("orders")
	withAckWait.AckWait = 45 * time.Second
	_, err := s.Create(ctx, withAckWait, false)
	require.NoError(t, err)
	e, err := s.Get(ctx, "orders")
	require.NoError(t, err)
	require.Empty(t, e.Document.AckWait, "not written")
	require.Zero(t, e.Subscription.AckWait)

	kv, err := js.KeyValue(ctx, s.Bucket())
	require.NoError(t, err)
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{{"45s", 45 * time.Second}, {"soon", 0}} {
		raw, err := kv.Get(ctx, "orders")
		require.NoError(t, err)
		var doc map[string]any
		require.NoError(t, json.Unmarshal(raw.Value(), &doc))
		doc["ack_wait"] = tc.value // as an earlier release wrote it
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		_, err = kv.Put(ctx, "orders", b)
		require.NoError(t, err)
		e, err := s.Get(ctx, "orders")
		require.NoError(t, err, "ack_wait %q", tc.value)
		require.Equal(t, tc.want, e.Subscription.AckWait, "ack_wait %q", tc.value)
		require.Equal(t, "https://hooks.example.com/in?token=abc", e.Subscription.URL)
	}
}
