package deliver_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A Fleet applies changes while it runs: a subscription Put starts; Put
// again with another field restarts it where it was; with other secrets
// only, the next attempt signs with them; Pause stops it with nothing
// lost; Remove deletes its durable consumer; an invalid Put is refused
// and what runs keeps running.
func TestFleetAppliesChangesWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	f, err := deliver.NewFleet(b.js, deliver.Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	s := sub("fleet", rc.URL)
	require.NoError(t, f.Put(s))
	require.Equal(t, []string{"fleet"}, f.Names())
	for i := range 5 {
		b.publish(t, int64(i+1), "order-1", "OrderPlaced", `{}`)
	}
	rc.waitFor(t, 5)
	requireSettled(t, b, "fleet", 5)

	// Another field: restarted, its durable keeps its position (nothing
	// delivered twice).
	s.MaxInFlight = 3
	require.NoError(t, f.Put(s))
	b.publish(t, 6, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 6)
	requireSettled(t, b, "fleet", 6)

	// Other secrets only: the next attempt signs with them.
	next := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fleet-test-next-secret-0123456"))
	s.Secrets = []string{next}
	require.NoError(t, f.Put(s))
	b.publish(t, 7, "order-1", "OrderPlaced", `{}`)
	reqs := rc.waitFor(t, 7)
	v, err := webhook.NewVerifier(webhook.SchemeStandard, []string{next})
	require.NoError(t, err)
	require.NoError(t, v.Verify(reqs[6].header, reqs[6].body), "signed with the new secret")

	// Invalid: refused, the running one keeps delivering.
	bad := s
	bad.FilterSubjects = []string{"events..x"}
	require.ErrorIs(t, f.Put(bad), subscription.ErrInvalidSubscription)

	// Paused: nothing delivered, nothing lost.
	f.Pause("fleet")
	require.Empty(t, f.Names())
	for i := 8; i <= 10; i++ {
		b.publish(t, int64(i), "order-1", "OrderPlaced", `{}`)
	}
	require.Never(t, func() bool { return rc.count() > 7 }, 300*time.Millisecond, 10*time.Millisecond)
	require.NoError(t, f.Put(s))
	rc.waitFor(t, 10)
	requireSettled(t, b, "fleet", 10)
	require.Equal(t, 10, rc.count(), "each event once")

	// Removed: the durable consumer and its parked-stream state are gone
	// (another subscription's stay), and removing again is fine.
	parks, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	for _, k := range []string{wire.ParkedKey("fleet", "order.order-1"), wire.AttemptsKey("fleet", "9"), wire.DeliveredKey("fleet", 0), wire.ParkedKey("other", "order.order-1")} {
		_, err := parks.Put(b.ctx, k, []byte("x"))
		require.NoError(t, err)
	}
	require.NoError(t, f.Remove(b.ctx, "fleet"))
	l, err := parks.ListKeys(b.ctx)
	require.NoError(t, err)
	var left []string
	for k := range l.Keys() {
		left = append(left, k)
	}
	require.Equal(t, []string{wire.ParkedKey("other", "order.order-1")}, left)
	_, err = b.js.Consumer(b.ctx, "EVENTS", "fleet")
	require.True(t, errors.Is(err, jetstream.ErrConsumerNotFound), "%v", err)
	require.NoError(t, f.Remove(b.ctx, "fleet"))
}
