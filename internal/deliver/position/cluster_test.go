package position

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
)

// On a 3-node cluster with an R3 bucket, an owner connected to a node
// that does not lead the bucket commits back to back, each commit
// waited for, and none is taken for a new owner's (a refusal is read
// from the bucket's leader, wherever the client is connected); a claim
// made through another node stops it at its next commit, and the new
// owner read everything it committed, its cursor keys too.
func TestOnAClusterBackToBackCommitsKeepTheirOwnerUntilAClaim(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster")
	}
	t.Parallel()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: 3, Name: "positions", Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(c.Shutdown)
	ctx := t.Context()
	connect := func(n *embedded.Node) jetstream.JetStream {
		nc, err := nats.Connect(n.ClientURL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	js := connect(c.Nodes()[0])
	_, err = Bucket(ctx, js, "", 3)
	require.NoError(t, err)
	leader := c.StreamLeader("KV_" + DefaultBucket)
	require.NotNil(t, leader)
	var followers []*embedded.Node
	for _, n := range c.Nodes() {
		if n != leader {
			followers = append(followers, n)
		}
	}
	ajs := connect(followers[0])
	akv, err := ajs.KeyValue(ctx, DefaultBucket)
	require.NoError(t, err)
	// The bucket's leader is elected before its message get API answers
	// through every node (until then: no responders); a claim right after
	// the bucket was made would fail there, and its caller would claim
	// again at its next cycle. This test is about the commits after it.
	require.Eventually(t, func() bool { _, _, err := leaderGet(ctx, ajs, DefaultBucket, Key(0)); return err == nil },
		10*time.Second, 20*time.Millisecond, "the bucket's leader answers message gets")
	// The claim's first read is the bucket's Get, a direct get, which
	// answers "no responders" until the bucket's direct get is served
	// through this node too.
	require.Eventually(t, func() bool {
		_, err := akv.Get(ctx, Key(0))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 20*time.Millisecond, "the bucket answers direct gets")
	var logs lockedBuffer
	a, err := Claim(ctx, ajs, akv, Config{Owner: "replica-a", Epoch: 1, Archetype: base.New(nil, slog.New(slog.NewTextHandler(&logs, nil)), "")})
	require.NoError(t, err)
	ar := run(t, a)

	const commits = 300
	for i := range uint64(commits) {
		stream := fmt.Sprintf("order-%d", i%10)
		a.Settled("s1", stream, Entry{Seq: 100 + i, Version: i / 10})
		require.NoError(t, a.Wait(ctx, "s1", stream, 100+i), "commit %d", i)
	}
	a.Detach("s2", "paused")
	a.Settled("s2", "order-1", Entry{Seq: 100 + commits, Version: 7})
	require.NoError(t, a.Wait(ctx, "s2", "order-1", 100+commits))
	require.True(t, pending((<-chan struct{})(ar.done)), "still the owner after %d commits", commits)
	t.Logf("%d commits; refused and written again from the leader's revision: %d", commits, strings.Count(logs.String(), "writing again from its revision"))

	bjs := connect(followers[1])
	bkv, err := bjs.KeyValue(ctx, DefaultBucket)
	require.NoError(t, err)
	b, err := Claim(ctx, bjs, bkv, Config{Owner: "replica-b", Epoch: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"s2"}, keys(b.Cursors()), "the cursor keys are listed and read from the bucket's leader")
	require.True(t, b.Cursors()["s2"].Covers("order-1", 100+commits))
	taken := b.Record()
	for i := range uint64(commits) {
		require.True(t, taken.Covers("s1", fmt.Sprintf("order-%d", i%10), 100+i))
	}
	a.Settled("s1", "order-0", Entry{Seq: 101 + commits, Version: 99})
	require.ErrorIs(t, a.Wait(ctx, "s1", "order-0", 101+commits), ErrLost)
	<-ar.done
	require.ErrorIs(t, ar.err, ErrLost)
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
