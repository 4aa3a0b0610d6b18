package consumer_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// Consumer.ReplayWindow, without Start: the window's events in order, the
// progress, and the event a failure stopped at, in the front door's types.
func TestReplayWindowThroughTheFrontDoor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	events, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	for _, id := range []string{"1", "2", "3"} {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.DefaultEventsPrefix, "order-1", "Noted"),
			Header: nats.Header{wire.HeaderMsgID: []string{id}}, Data: []byte(`{}`)})
		require.NoError(t, err)
	}
	first, err := events.GetMsg(ctx, 1)
	require.NoError(t, err)

	var mu sync.Mutex
	var got []string
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.HeaderIdempotencyKey)
		mu.Lock()
		got = append(got, id)
		mu.Unlock()
		if id == "3" {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)
	c, err := consumer.New(js, consumer.Config{Subscriptions: []consumer.Subscription{sub("orders", rc.URL)}})
	require.NoError(t, err)

	var progress []string
	res, err := c.ReplayWindow(ctx, "orders", consumer.Window{Since: first.Time,
		Progress: func(r consumer.WindowResult) { progress = append(progress, r.Last.EventID) }})
	require.NoError(t, err)
	require.Equal(t, []string{"1", "2", "3"}, got)
	require.Equal(t, []string{"1", "2"}, progress)
	require.Equal(t, 2, res.Delivered)
	require.Equal(t, consumer.WindowPosition{EventID: "2", Seq: 2, Time: res.Last.Time, Stream: "order-1"}, res.Last)
	require.NotNil(t, res.Failed)
	require.Equal(t, "3", res.Failed.EventID)
	require.Equal(t, uint64(3), res.Failed.Seq)
	require.Equal(t, http.StatusGone, res.Failed.Status)

	_, err = c.ReplayWindow(ctx, "orders", consumer.Window{})
	require.ErrorIs(t, err, consumer.ErrInvalidWindow)
	_, err = c.ReplayWindow(ctx, "billing", consumer.Window{Since: first.Time})
	require.ErrorIs(t, err, consumer.ErrUnknownSubscription)
}
