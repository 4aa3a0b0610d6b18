package deliver_test

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// On a 3-node cluster the DLQ stream and the durable consumers are created
// with the replicas asked for; asked again for another count, both are left
// as they are and a warning names the stream or consumer, have and want.
func TestProvisionReplicasOnCluster(t *testing.T) {
	t.Parallel()
	_, js := jsbridgetest.ConnectCluster(t, jsbridgetest.StartCluster(t, embedded.ClusterConfig{Nodes: 3, Name: "dlv"}))
	b := bundle{js: js, ctx: t.Context()}
	_, err := js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Replicas: 3})
	require.NoError(t, err)
	rc := newReceiver(t, status(http.StatusOK))

	logs := &syncLog{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	require.NoError(t, deadletter.New(js, deadletter.Config{Replicas: 3, Logger: log}).Provision(b.ctx))
	dlq, err := js.Stream(b.ctx, wire.DefaultDLQStream)
	require.NoError(t, err)
	require.Equal(t, 3, dlq.CachedInfo().Config.Replicas)

	c, err := deliver.New(js, deliver.Config{Replicas: 3, Logger: log}, sub("a", rc.URL))
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	cons, err := js.Consumer(b.ctx, "EVENTS", "a")
	require.NoError(t, err)
	info, err := cons.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	require.Len(t, info.Cluster.Replicas, 2, "a leader and two followers")
	require.Empty(t, logs.String(), "no warning when the counts match")

	require.NoError(t, deadletter.New(js, deadletter.Config{Replicas: 1, Logger: log}).Provision(b.ctx))
	require.Contains(t, logs.String(), "JetStream stream DLQ has 3 replica(s), not the 1 asked for")
	after, err := dlq.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, after.Config.Replicas, "an existing DLQ stream's replica count is not changed")

	c1, err := deliver.New(js, deliver.Config{Replicas: 1, Logger: log}, sub("a", rc.URL))
	require.NoError(t, err)
	require.NoError(t, c1.Provision(b.ctx))
	require.Contains(t, logs.String(), "durable consumer a on JetStream stream EVENTS has 3 replica(s), not the 1 asked for")
	info, err = cons.Info(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas, "an existing durable consumer's replica count is not changed")
}

// Replicas 0 (the default) leaves the durable consumer's count to
// JetStream, which gives it the stream's; a negative count is refused.
func TestProvisionReplicasDefaultFollowsStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusOK))
	c, err := deliver.New(b.js, deliver.Config{}, sub("a", rc.URL))
	require.NoError(t, err)
	require.NoError(t, c.Provision(b.ctx))
	cons, err := b.js.Consumer(b.ctx, "EVENTS", "a")
	require.NoError(t, err)
	require.Zero(t, cons.CachedInfo().Config.Replicas)

	_, err = deliver.New(b.js, deliver.Config{Replicas: -1}, sub("a", rc.URL))
	require.ErrorContains(t, err, "Config.Replicas -1")
}
