package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/wire"
)

// The engine's time is the Consumer's one clock, given through
// newConsumer (never through Config): the engine's Run, whose start
// fails while the events stream is missing, tries again only once that
// clock passed its backoff (at least 0.4 s), and starts then.
func TestEngineRetriesItsStartOnTheConsumersClock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	clock := clockwork.NewFakeClock()
	c, err := newConsumer(js, Config{Subscriptions: []Subscription{{Name: "orders", URL: "http://127.0.0.1:1/hook",
		FilterSubjects: []string{"events.>"}, Secrets: []string{"whsec_MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE="}, AllowPrivate: true}},
		ReplicaID: "replica-a", Partitions: 2, LeaseTTL: time.Second, Logger: slog.New(slog.DiscardHandler)}, clock)
	require.NoError(t, err)
	require.Same(t, clock, c.arch.Clock)

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.engine.Run(runCtx) }()
	defer func() { stop(); require.NoError(t, <-ran) }()

	// The first start failed (no events stream): Run waits on the clock.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{"events.>"}, AllowDirect: true})
	require.NoError(t, err)
	// A started replica heartbeats in the lease bucket, which its start
	// creates.
	started := func() bool {
		kv, err := js.KeyValue(ctx, wire.DefaultLeaseBucket)
		if err != nil {
			return false
		}
		_, err = kv.Get(ctx, owner.MemberKey("replica-a"))
		return err == nil
	}
	require.False(t, started(), "no start before the clock moved")
	clock.Advance(time.Minute)
	require.Eventually(t, started, 10*time.Second, 10*time.Millisecond, "started once the clock passed the backoff")
}
