package embedded_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
)

// publishUntilAcked publishes with a Nats-Msg-Id and retries briefly while a
// stream leader is being elected; the id keeps retries from duplicating.
func publishUntilAcked(ctx context.Context, t *testing.T, js jetstream.JetStream, subject, id string) {
	t.Helper()
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := js.Publish(pctx, subject, []byte(id), jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return
		}
		require.NoError(t, ctx.Err(), "publish %s: last error %v", id, err)
		time.Sleep(20 * time.Millisecond)
	}
}

// A 3-node cluster keeps an R3 stream's messages when the stream leader is
// killed, elects another leader that takes writes, and the killed node,
// restarted from its store, catches up with what was written without it.
func TestClusterSurvivesStreamLeaderShutdownAndRestartCatchesUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	start := time.Now()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: 3, Dir: t.TempDir(), Name: "t"})
	require.NoError(t, err)
	defer c.Shutdown()
	t.Logf("cluster ready in %s", time.Since(start))
	require.Len(t, c.Nodes(), 3)
	require.Len(t, strings.Split(c.ClientURLs(), ","), 3)

	nc, err := c.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage, Replicas: 3,
	})
	require.NoError(t, err)
	require.Equal(t, 3, st.CachedInfo().Config.Replicas)

	for i := range 5 {
		publishUntilAcked(ctx, t, js, "t.a", fmt.Sprintf("before-%d", i))
	}
	leader := c.StreamLeader("T")
	require.NotNil(t, leader)
	leader.Shutdown()
	require.False(t, leader.Running())
	killed := time.Now()

	for i := range 5 {
		publishUntilAcked(ctx, t, js, "t.a", fmt.Sprintf("after-%d", i))
		if i == 0 {
			t.Logf("first publish acked %s after the stream leader's shutdown", time.Since(killed))
		}
	}
	newLeader := c.StreamLeader("T")
	require.NotNil(t, newLeader)
	require.NotEqual(t, leader.Name(), newLeader.Name())
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(10), info.State.Msgs)

	_, _, err = leader.LocalStreamState("T")
	require.ErrorIs(t, err, embedded.ErrNodeDown)
	require.NoError(t, leader.Restart())
	restarted := time.Now()
	require.Eventually(t, func() bool {
		s, ok, err := leader.LocalStreamState("T")
		return err == nil && ok && s.Msgs == 10 && s.LastSeq == 10
	}, 20*time.Second, 20*time.Millisecond, "restarted node never held all 10 messages")
	t.Logf("restarted node caught up %s after Restart returned", time.Since(restarted))
}

func TestStartClusterRequiresDir(t *testing.T) {
	t.Parallel()
	_, err := embedded.StartCluster(embedded.ClusterConfig{})
	require.ErrorContains(t, err, "Dir is required")
}

// With one node down, another shut down and restarted brings back a
// majority: Restart returns once the two running nodes have a meta leader
// again. A node whose port another program took meanwhile says so.
func TestClusterRestartWithANodeDownAndPortTaken(t *testing.T) {
	t.Parallel()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: 3, Dir: t.TempDir(), Name: "r"})
	require.NoError(t, err)
	defer c.Shutdown()
	n1, n2, n3 := c.Nodes()[0], c.Nodes()[1], c.Nodes()[2]

	n3.Shutdown()
	u, err := url.Parse(n3.ClientURL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", u.Host)
	require.NoError(t, err)
	err = n3.Restart()
	require.ErrorIs(t, err, embedded.ErrPortInUse)
	require.Contains(t, err.Error(), u.Port())
	require.NoError(t, ln.Close())

	n2.Shutdown() // n1 alone: no majority
	require.NoError(t, n2.Restart())
	require.True(t, n1.Running() && n2.Running() && !n3.Running())
	nc, err := c.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "R2", Subjects: []string{"r2.>"}, Replicas: 2})
	require.NoError(t, err)
}
