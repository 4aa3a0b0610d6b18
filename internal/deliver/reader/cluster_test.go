package reader_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// The server hosting the reader's consumer (R1, memory) is shut down
// mid-flow on a 3-node cluster with the events at R3: the reader
// recreates its consumer on a live server from the last sequence it read
// + 1 and hands on every event once, in order (design E4, as a test).
func TestReaderHandsOnEveryEventOnceAcrossItsServersLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster and waits for a consumer's recovery (seconds)")
	}
	t.Parallel()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(c.Shutdown)
	nc, err := c.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	require.Eventually(t, func() bool { // a new cluster may refuse an R3 stream for a moment
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream,
			Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, Replicas: 3, AllowDirect: true})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)

	publish := func(from, n int) {
		for k := from; k < from+n; k++ {
			subject := wire.Subject(wire.DefaultEventsPrefix, fmt.Sprintf("c-%d", k%50), "Happened")
			require.Eventually(t, func() bool { // through the loss of a node and an election
				attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := js.Publish(attempt, subject, []byte(`{}`), jetstream.WithMsgID(fmt.Sprintf("id-%d", k)))
				return err == nil
			}, time.Minute, 100*time.Millisecond)
		}
	}
	publish(0, 100)
	r, err := reader.Open(ctx, js, reader.Config{}, 1)
	require.NoError(t, err)
	t.Cleanup(r.Stop)
	for p := range partitions {
		require.NoError(t, r.Take(p, 0))
	}
	var got []uint64
	read := func(n int) {
		for range n {
			ev, err := r.Next(ctx)
			require.NoError(t, err)
			got = append(got, ev.Seq)
		}
	}
	read(50)
	host := r.ConsumerHost()
	require.NotEmpty(t, host)
	for _, n := range c.Nodes() {
		if n.Name() == host {
			n.Shutdown()
		}
	}
	lost := time.Now()
	publish(100, 100)
	read(150)
	t.Logf("the reader's server %s shut down; 150 more events handed on %v later", host, time.Since(lost).Round(time.Millisecond))
	for i, seq := range got {
		require.Equal(t, uint64(i+1), seq, "every event once, in order")
	}
}
