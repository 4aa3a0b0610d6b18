package shared_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/wire"
)

// A subscription removed (deleted from the subscriptions bucket) takes
// its failure streak with it: the streak key in the health bucket is
// deleted, so one added again under the name starts without it
// (docs/wire.md).
func TestARemovedSubscriptionsStreakKeyIsDeleted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream server and a replica")
	}
	w := newWorld(t)
	down := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(down.Close)
	sub := w.subs[1]
	sub.URL, sub.MaxDeliver, sub.BackOff = down.URL+"/hook", -1, []time.Duration{50 * time.Millisecond}
	w.subs = w.subs[:1] // the ordered one delivers; sub fails
	w.subs = append(w.subs, sub)
	w.opts = func(cfg *shared.Config, _ *shared.Deps) {
		cfg.Health.DisableAfter, cfg.Health.DisableMinFailures = time.Hour, 2
	}
	r := w.replica(t, "replica-a")
	w.publish(t, 20)
	kv, err := w.js.KeyValue(t.Context(), wire.DefaultHealthBucket)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kv.Get(t.Context(), wire.StreakKey(sub.Name))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the failing subscription's streak is in the health bucket")

	require.NoError(t, r.Remove(t.Context(), sub.Name))
	_, err = kv.Get(t.Context(), wire.StreakKey(sub.Name))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the removed subscription's streak key is deleted")
}
