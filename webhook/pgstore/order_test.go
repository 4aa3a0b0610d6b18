package pgstore_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/webhook/ordertest"
	"github.com/jsbridge/jsbridge/webhook/pgstore"
)

func newOrderStore(t *testing.T, b bundle) *pgstore.OrderStore {
	t.Helper()
	s, err := pgstore.NewOrderStore(b.pool, pgstore.WithOrderTable(b.table))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

func TestOrderStore(t *testing.T) {
	t.Parallel()
	ordertest.Run(t, func(t *testing.T) webhook.OrderStore { return newOrderStore(t, setup(t)) })
}

// TestOrderStoreReplicas: two receiver replicas, each with its own pool
// on one table, never process a stream out of order between them.
func TestOrderStoreReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	newOrderStore(t, b) // migrate
	var stores []webhook.OrderStore
	for range 2 {
		s, err := pgstore.NewOrderStore(jsbridgetest.Pool(t), pgstore.WithOrderTable(b.table))
		require.NoError(t, err)
		stores = append(stores, s)
	}
	ordertest.Hammer(t, stores...)
}

// TestOrderStoreKeepsLargeEpochs: an epoch is a uint64, all of it.
func TestOrderStoreKeepsLargeEpochs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newOrderStore(t, setup(t))
	key := webhook.OrderKey{Source: "/s", Stream: "order-1"}
	_, lock, err := s.Lock(ctx, key)
	require.NoError(t, err)
	want := webhook.OrderPosition{Version: math.MaxInt64, Epoch: math.MaxUint64, Partition: 1023}
	require.NoError(t, lock.Advance(ctx, want))
	pos, err := s.Position(ctx, key)
	require.NoError(t, err)
	require.Equal(t, want, pos)
}

func TestNewOrderStoreRejectsBadInput(t *testing.T) {
	t.Parallel()
	pool := jsbridgetest.Pool(t)
	_, err := pgstore.NewOrderStore(nil)
	require.ErrorIs(t, err, pgstore.ErrInvalidOption)
	for _, name := range []string{"", "a..b", "a.b.c", ".x"} {
		_, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable(name))
		require.ErrorIs(t, err, pgstore.ErrInvalidOption, "table %q", name)
		require.ErrorContains(t, err, fmt.Sprintf("%q", name))
	}
	s, err := pgstore.NewOrderStore(pool, pgstore.WithOrderTable("never_created"))
	require.NoError(t, err)
	_, _, err = s.Lock(context.Background(), webhook.OrderKey{Stream: "x"})
	require.ErrorContains(t, err, "never_created", "a missing table fails the lock, naming it")
}
