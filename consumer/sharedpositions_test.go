package consumer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// ReadSharedPositions reads the shared engine's partition records and
// cursors back as an owner committed them, decoded; without the positions
// bucket it reads none.
func TestReadSharedPositions(t *testing.T) {
	ctx := context.Background()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	none, err := consumer.ReadSharedPositions(ctx, js)
	require.NoError(t, err)
	require.Empty(t, none, "no positions bucket")

	kv, err := position.Bucket(ctx, js, "", 1)
	require.NoError(t, err)
	p, err := position.Claim(ctx, js, kv, position.Config{Partition: 5, Owner: "replica-a", Epoch: 4})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	p.Edit(func(r *position.Record) { r.Floor, r.Members["orders"], r.Members["audit"] = 40, 0, 0 })
	p.Settled("orders", "order-42", position.Entry{Seq: 44, Version: 3})
	require.True(t, p.Detach("audit", "breaker"))
	require.NoError(t, p.Wait(ctx, "orders", "order-42", 44))

	got, err := consumer.ReadSharedPositions(ctx, js)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, 5, got[0].Partition)
	require.Equal(t, "replica-a", got[0].Record.Owner)
	require.Equal(t, uint64(4), got[0].Record.Epoch)
	require.Equal(t, uint64(40), got[0].Record.Floor)
	require.Equal(t, position.Entry{Seq: 44, Version: 3}, got[0].Record.Ahead["orders"]["order-42"])
	require.Equal(t, "breaker", got[0].Cursors["audit"].State)
	require.Equal(t, uint64(40), got[0].Cursors["audit"].Floor)
}
