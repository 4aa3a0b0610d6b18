package jsbridgetest_test

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

func TestOrderWebhookExample(t *testing.T) {
	t.Parallel()
	testOrderWebhook(t)
}

// Stored reads what the bridge put in JetStream: per stream, in order,
// Nats-Msg-Id = event id; WaitFor returns an event's delivery.
func TestStoredAndWaitFor(t *testing.T) {
	t.Parallel()
	kit := jsbridgetest.Start(t, jsbridgetest.Config{})
	a := kit.Append(t, "order-1", store.NewEvent{Name: "OrderPlaced", Data: []byte(`{}`)}, store.NewEvent{Name: "OrderPaid", Data: []byte(`{}`)})
	b := kit.Append(t, "cart-9", store.NewEvent{Name: "ItemAdded", Data: []byte(`{"sku":"x"}`)})
	d := kit.Receiver.WaitFor(t, b[0])
	require.Equal(t, "cart-9", d.Stream)
	require.Equal(t, "ItemAdded", d.Type)
	kit.Receiver.WaitFor(t, a[1])

	msgs := kit.Stored(t, wire.StreamFilter(wire.DefaultEventsPrefix, "order-1"))
	require.Len(t, msgs, 2)
	for i, m := range msgs {
		require.Equal(t, a[i], m.Headers().Get(wire.HeaderMsgID))
	}
	require.Len(t, kit.Stored(t, ""), 3)
	require.Empty(t, kit.Stored(t, wire.StreamFilter(wire.DefaultEventsPrefix, "nobody")))
}

// The receiver records only requests whose signature verifies, says why
// the others failed, and counts attempts answered with a failure status.
func TestReceiverVerifiesAndRecords(t *testing.T) {
	t.Parallel()
	r := jsbridgetest.NewReceiver(t, jsbridgetest.ReceiverConfig{Respond: func(d jsbridgetest.Delivery) int {
		if d.EventID == "2" {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}})
	post := func(id string, secret string) int {
		body := []byte(`{"specversion":"1.0","id":"` + id + `","source":"s","type":"T","subject":"order-1","streamversion":0,"data":{}}`)
		req, err := http.NewRequest(http.MethodPost, r.URL(), bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(wire.HeaderContentType, event.ContentTypeCloudEventsJSON)
		req.Header.Set(wire.HeaderIdempotencyKey, id)
		if secret != "" {
			s, err := webhook.NewSigner(webhook.SchemeStandard, secret)
			require.NoError(t, err)
			s.Sign(req.Header, id, time.Now(), body)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, post("1", ""))
	require.Equal(t, http.StatusUnauthorized, post("1", "whsec_"+strings.Repeat("QUFB", 8)))
	require.Equal(t, http.StatusServiceUnavailable, post("2", r.Secrets()[0]))
	require.Equal(t, http.StatusNoContent, post("1", r.Secrets()[0]))
	require.Equal(t, []string{"missing-signature", "bad-signature"}, r.Rejected())
	require.Equal(t, 2, r.Attempts())
	ds := r.Deliveries()
	require.Len(t, ds, 1)
	require.Equal(t, "1", ds[0].EventID)
	require.Equal(t, "1", r.WaitFor(t, "1").IdempotencyKey)

	// An event out of order fails RequireStream at once.
	ft := &fatalTB{TB: t}
	ft.run(func() { r.RequireStream(ft, "order-1", "0", "1") })
	require.Contains(t, ft.msg, "delivery 1 at position 0 of stream order-1")
}

// fatalTB records Fatalf instead of failing the test, to check a helper's
// failure.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn on its own goroutine, which Fatalf ends.
func (f *fatalTB) run(fn func()) {
	var wg sync.WaitGroup
	wg.Go(fn)
	wg.Wait()
}

// An endpoint that answers 422 gets the event once; the consumer
// dead-letters it, and the test reads the dead letter through the kit.
func TestRejectedEventIsDeadLettered(t *testing.T) {
	t.Parallel()
	kit := jsbridgetest.Start(t, jsbridgetest.Config{Receiver: jsbridgetest.ReceiverConfig{
		Respond: func(jsbridgetest.Delivery) int { return http.StatusUnprocessableEntity },
	}})
	ids := kit.Append(t, "order-5", store.NewEvent{Name: "OrderPlaced", Data: []byte(`{}`)})
	ctx := t.Context()
	require.Eventually(t, func() bool {
		n, err := kit.Consumer.DeadLetters().Count(ctx, jsbridgetest.DefaultSubscription)
		return err == nil && n == 1
	}, jsbridgetest.DefaultWait, 20*time.Millisecond, "dead letter written")
	letters, err := kit.Consumer.DeadLetters().List(ctx, jsbridgetest.DefaultSubscription)
	require.NoError(t, err)
	require.Equal(t, ids[0], letters[0].EventID)
	require.Equal(t, http.StatusUnprocessableEntity, letters[0].Status)
	require.Equal(t, 1, kit.Receiver.Attempts(), "a 422 is tried once")
	require.Empty(t, kit.Receiver.Deliveries())
}
