package park

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/wire"
)

// The sweep removes the delete markers that settled attempt counts and
// unparked streams leave in the park bucket, only those older than the
// cutoff and only of its subscriptions; a value written after a marker
// (a stream parked again) and live values stay. The run loop sweeps once
// per markerSweepEvery of its clock.
func TestMarkerSweepRemovesOldDeleteMarkersOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket, Storage: jetstream.FileStorage, History: 1})
	require.NoError(t, err)
	put := func(key string) {
		_, err := kv.Put(ctx, key, []byte("1"))
		require.NoError(t, err)
	}
	del := func(key string) { require.NoError(t, kv.Delete(ctx, key)) }
	msgs := func() uint64 {
		st, err := js.Stream(ctx, "KV_"+wire.DefaultParkBucket)
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs
	}

	// orders: 100 settled attempt counts, a stream unparked, a stream
	// unparked and parked again, a stream still parked, a count still live.
	for i := range 100 {
		k := wire.AttemptsKey("orders", string(rune('a'+i%26))+string(rune('a'+i/26)))
		put(k)
		del(k)
	}
	put(wire.ParkedKey("orders", "0a"))
	del(wire.ParkedKey("orders", "0a"))
	put(wire.ParkedKey("orders", "0b"))
	del(wire.ParkedKey("orders", "0b"))
	put(wire.ParkedKey("orders", "0b"))
	put(wire.ParkedKey("orders", "0c"))
	put(wire.AttemptsKey("orders", "live"))
	// another subscription's marker: not this sweep's.
	put(wire.AttemptsKey("refunds", "x"))
	del(wire.AttemptsKey("refunds", "x"))
	// With one message per key: 101 markers of orders, one of refunds, and
	// 0b, 0c and the live count.
	require.EqualValues(t, 101+1+3, msgs())

	clock := clockwork.NewFakeClockAt(time.Now())
	s := Sweep{JS: js, Bucket: kv, Subscriptions: []string{"orders"}, Clock: clock, Logger: slog.New(slog.DiscardHandler)}
	n, err := s.sweep(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Zero(t, n, "markers younger than the cutoff stay")

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { s.Run(runCtx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	// The first sweep, a minute after the start, finds every marker a
	// minute old: all stay. It has run once the loop waits again.
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(markerSweepFirst)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.EqualValues(t, 101+1+3, msgs(), "markers younger than markerMinAge stay")
	// The next, an hour later, finds them 61 minutes old.
	clock.Advance(markerSweepEvery)
	require.Eventually(t, func() bool { return msgs() == 3+1 }, 10*time.Second, 10*time.Millisecond,
		"left: 0b parked again, 0c, the live count and refunds' marker")
	for _, k := range []string{wire.ParkedKey("orders", "0b"), wire.ParkedKey("orders", "0c"), wire.AttemptsKey("orders", "live")} {
		_, err := kv.Get(ctx, k)
		require.NoError(t, err, "live key %s", k)
	}
	_, err = kv.Get(ctx, wire.AttemptsKey("refunds", "x"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "another subscription's marker stays a delete")

	// A stream parked again between the sweep's read and its purge keeps
	// its new entry.
	put(wire.ParkedKey("orders", "0d"))
	del(wire.ParkedKey("orders", "0d"))
	old, err := s.markers(ctx, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, []marker{{wire.ParkedKey("orders", "0d"), old[0].rev}}, old)
	put(wire.ParkedKey("orders", "0d"))
	n, err = s.remove(ctx, old)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = kv.Get(ctx, wire.ParkedKey("orders", "0d"))
	require.NoError(t, err, "the entry written after the marker was read")
}
