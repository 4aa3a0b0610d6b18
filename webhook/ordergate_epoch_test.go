package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// TestOrderGateStaleEpochNamesTheEpoch: a stale-epoch answer names the
// highest epoch processed for the stream (Jsbridge-Order-Epoch), so the
// sender can raise its epochs above it; docs/receiver.md says so.
func TestOrderGateStaleEpochNamesTheEpoch(t *testing.T) {
	t.Parallel()
	next := &countingHandler{}
	srv := httptest.NewServer(webhook.NewOrderGate(webhook.NewMemoryOrderStore(), quietGate).Middleware(next))
	t.Cleanup(srv.Close)
	status, _, body := do(t, srv, binary("s", "0", "1", "1800000000000000"), `{}`)
	require.Equal(t, http.StatusNoContent, status, body)
	status, h, _ := do(t, srv, binary("s", "1", "1", "7"), `{}`)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, wire.OrderStaleEpoch, h.Get(wire.HeaderOrder))
	require.Equal(t, "1800000000000000", h.Get(wire.HeaderOrderEpoch))
	status, h, _ = do(t, srv, binary("s", "2", "1", "1800000000000000"), `{}`)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, wire.OrderGap, h.Get(wire.HeaderOrder))
	require.Empty(t, h.Get(wire.HeaderOrderEpoch), "only a stale-epoch answer names it")
	require.Equal(t, 1, next.count())
	require.Contains(t, readReceiverDoc(t), "`"+wire.HeaderOrderEpoch+"`")
}

func readReceiverDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/receiver.md")
	require.NoError(t, err)
	return string(doc)
}
