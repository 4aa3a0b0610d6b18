package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// A stream whose versions start at 1 (an events table drained through a
// view, say: docs/events-table.md) starts with the version chain: version
// 1 comes after none. From a sender before the chain it never passes a
// default order gate: the gate waits for version 0, so version 1 is a gap
// (409) on every retry. WithGateFirstSeen lets the first version seen
// start the stream.
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

	chained := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate).Middleware(next))
	t.Cleanup(chained.Close)
	for v := range 3 {
		h := binary("order-1", strconv.Itoa(v+1), "0", "1")
		h.Set(wire.HeaderPreviousVersion, wire.FormatPreviousVersion(int64(v))) // versions 1, 2, 3 after 0, 1, 2 …
		if v == 0 {
			h.Set(wire.HeaderPreviousVersion, wire.PreviousNone) // … but version 1 is the stream's first
		}
		status, _, body := do(t, chained, h, `{}`)
		require.Equal(t, http.StatusNoContent, status, "version %d: %s", v+1, body)
	}
	require.Equal(t, 6, next.count())
}
