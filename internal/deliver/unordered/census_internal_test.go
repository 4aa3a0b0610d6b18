package unordered

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// The census finds a durable consumer deleted behind a unit's back: a
// listing that still has it says nothing, the first listing without it
// (after one that began after the watch) is confirmed by the consumer's
// info and reported; a listing made before the consumer existed is not
// taken for its deletion.
func TestCensusReportsADeletedConsumer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	c := NewCensus(js, "EVENTS", clockwork.NewFakeClock())
	c.list(ctx) // before the consumer exists
	require.True(t, c.lacks("sub"))
	cons, err := js.CreateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "sub", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)

	gone := make(chan bool, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { gone <- c.WatchGone(wctx, "sub", cons) }()
	for range 3 {
		c.list(ctx) // it exists: nothing reported
	}
	require.False(t, c.lacks("sub"))
	select {
	case <-gone:
		t.Fatal("reported gone while it exists")
	default:
	}
	require.NoError(t, js.DeleteConsumer(ctx, "EVENTS", "sub"))
	require.Eventually(t, func() bool {
		c.list(ctx)
		select {
		case g := <-gone:
			require.True(t, g)
			return true
		default:
			return false
		}
	}, 10*time.Second, 20*time.Millisecond, "the deletion is reported")
}

// startJetStream starts an embedded JetStream server for the test (this
// package's internal tests cannot import jsbridgetest, which imports the
// engine that imports this package).
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}
