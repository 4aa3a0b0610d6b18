package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A stream whose versions start at 1 (an events table drained through a
// view, say: docs/events-table.md) never passes a default order gate:
// it waits for version 0, so version 1 is a gap (409) on every retry.
// WithGateFirstSeen lets the first version seen start the stream.
func TestOrderGateOneBasedStream(t *testing.T) {
	t.Parallel()
	next := &countingHandler{}
	strict := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate).Middleware(next))
	t.Cleanup(strict.Close)
	for range 2 {
		status, h, _ := do(t, strict, binary("order-1", "1", "0", "1"), `{}`)
		require.Equal(t, http.StatusConflict, status)
		require.Equal(t, wire.OrderGap, h.Get(wire.HeaderOrder))
	}
	require.Zero(t, next.count())

	firstSeen := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate, webhook.WithGateFirstSeen()).Middleware(next))
	t.Cleanup(firstSeen.Close)
	for _, v := range []string{"1", "2", "3"} {
		status, _, body := do(t, firstSeen, binary("order-1", v, "0", "1"), `{}`)
		require.Equal(t, http.StatusNoContent, status, "version %s: %s", v, body)
	}
	require.Equal(t, 3, next.count())
}
