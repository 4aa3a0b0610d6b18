package reader_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// cluster starts a 3-node JetStream cluster with the events stream at R3,
// AllowDirect on, and connects to it.
func cluster(t *testing.T) (*embedded.Cluster, jetstream.JetStream) {
	t.Helper()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(c.Shutdown)
	nc, err := c.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool { // a new cluster may refuse an R3 stream for a moment
		_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
			Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, Replicas: 3, AllowDirect: true})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond)
	return c, js
}

// The server hosting the reader's consumer (R1, memory) is shut down
// mid-flow on a 3-node cluster with the events at R3: the reader
// recreates its consumer on a live server from the last sequence it read
// + 1 and hands on every event once, in order (design E4, as a test).
func TestReaderHandsOnEveryEventOnceAcrossItsServersLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster and waits for a consumer's recovery (seconds)")
	}
	t.Parallel()
	c, js := cluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

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

// On a 3-node cluster with the events at R3, direct gets are answered at
// random by the stream's replica on the reads' server and by a replica
// that lags there: a mirror sealed at the first 101 messages, in the same
// queue group (a follower behind the leader, made to stay behind: a real
// follower catches up within milliseconds, too soon for a test to meet
// it answering short). Another follower is shut down for 100 events and
// restarted just before the reads (it serves direct gets once 90 %
// caught up). A cursor and a catch-up still hand on every event once, in
// order, up to their target, asking the leader what the lagging replica
// lacks.
func TestReadsOnAClusterWithLaggingReplicasHandOnEveryEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster and restarts a node (seconds)")
	}
	t.Parallel()
	c, js := cluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b := &bus{js: js, partition: map[uint64]int{}}
	b.publish(t, 100)
	leaderGets, host := lagging(t, js, false)
	b.publish(t, 200)

	// The reads' connection is to the mirror's server, where the mirror
	// and that server's replica of EVENTS answer direct gets at random.
	leader := c.StreamLeader(wire.DefaultEventsStream)
	require.NotNil(t, leader)
	var near, follower *embedded.Node
	for _, n := range c.Nodes() {
		switch {
		case n.Name() == host:
			near = n
		case n != leader:
			follower = n
		}
	}
	require.NotNil(t, near)
	rnc, err := nats.Connect(near.ClientURL())
	require.NoError(t, err)
	t.Cleanup(rnc.Close)
	rjs, err := jetstream.New(rnc)
	require.NoError(t, err)
	if follower != nil { // a follower that is neither the leader nor the reads' server
		follower.Shutdown()
		b.publish(t, 100)
		require.NoError(t, follower.Restart())
	}
	to := b.last()

	cur, err := reader.NewCursor(rjs, reader.Config{Batch: 4}, []string{"events.>"}, 1, to)
	require.NoError(t, err)
	var got []uint64
	for {
		ev, err := cur.Next(ctx)
		if errors.Is(err, reader.ErrCaughtUp) {
			break
		}
		require.NoError(t, err)
		got = append(got, ev.Seq)
	}
	var want []uint64
	for seq := uint64(1); seq <= to; seq++ {
		if b.partition[seq] >= 0 {
			want = append(want, seq)
		}
	}
	require.Equal(t, want, got, "the cursor: every event once, in order")

	r, err := reader.Open(ctx, rjs, reader.Config{Batch: 4}, to+1)
	require.NoError(t, err)
	t.Cleanup(r.Stop)
	for p := range partitions {
		require.NoError(t, r.Take(p, 0)) // all below the head: one catch-up of (0, to]
	}
	require.Equal(t, to, r.Head())
	got = got[:0]
	for range want {
		ev, err := r.Next(ctx)
		require.NoError(t, err)
		got = append(got, ev.Seq)
	}
	require.Equal(t, want, got, "the catch-up: every event once, in order")
	// Past the mirror's 101 messages a read position meets three short
	// answers in a row one time in eight: over some 150 positions (batches
	// of 4), the leader is asked all but surely.
	require.Positive(t, leaderGets.Load(), "what the lagging replica lacked came from the leader")
	t.Logf("%d events read twice over lagging replicas; %d message gets asked of the leader", len(want), leaderGets.Load())
}
