package jsbridgetest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/webhook"
)

// testOrderWebhook is an application's integration test, in its own
// _test.go file as TestOrderWebhook: three events appended to one stream
// reach the endpoint in order, each signed (the Receiver verified it) and
// carrying its event id as Idempotency-Key. Postgres comes from
// $JSBRIDGE_TEST_DATABASE_URL; everything else runs in the test process.
func testOrderWebhook(t *testing.T) {
	kit := jsbridgetest.Start(t, jsbridgetest.Config{})
	ids := kit.Append(t, "order-42",
		store.NewEvent{Name: "OrderPlaced", Data: []byte(`{"total":42}`)},
		store.NewEvent{Name: "OrderPaid", Data: []byte(`{"amount":42}`)},
		store.NewEvent{Name: "OrderShipped", Data: []byte(`{"carrier":"post"}`)})

	got := kit.Receiver.RequireStream(t, "order-42", ids...) // in order, each once
	for i, d := range got {
		require.Equal(t, ids[i], d.IdempotencyKey)
		require.NotEmpty(t, d.Header.Get(webhook.HeaderWebhookSignature))
		require.Equal(t, int64(i), d.Version)
	}
	require.Equal(t, "OrderPlaced", got[0].Type)
	require.JSONEq(t, `{"total":42}`, string(got[0].Data))
}

// The kit in an application's test: the whole file is the example; go
// test runs testOrderWebhook as TestOrderWebhookExample (kit_test.go).
func Example() {
	_ = testOrderWebhook
}
