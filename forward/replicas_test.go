package forward_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// On a 3-node cluster Provision creates the stream with 3 replicas; asked
// again for another count it reports the difference (stream, have, want)
// and leaves the stream as it is.
func TestProvisionReplicasOnClusterAndReportsDifference(t *testing.T) {
	t.Parallel()
	c := jsbridgetest.StartCluster(t, embedded.ClusterConfig{Nodes: 3, Name: "fwd"})
	_, js := jsbridgetest.ConnectCluster(t, c)

	p, err := forward.Provision(t.Context(), js, forward.StreamConfig{Replicas: 3})
	require.NoError(t, err)
	require.True(t, p.Created)
	require.Equal(t, 3, p.Replicas)
	require.Empty(t, p.Warnings)
	s, err := js.Stream(t.Context(), wire.DefaultEventsStream)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	require.Len(t, info.Cluster.Replicas, 2, "a leader and two followers")

	again, err := forward.Provision(t.Context(), js, forward.StreamConfig{Replicas: 3})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Empty(t, again.Warnings)

	fewer, err := forward.Provision(t.Context(), js, forward.StreamConfig{Replicas: 1})
	require.NoError(t, err)
	require.False(t, fewer.Created)
	require.Equal(t, 3, fewer.Replicas)
	require.Equal(t, []string{forward.ReplicasWarning("EVENTS", 3, 1)}, fewer.Warnings)
	require.Contains(t, fewer.Warnings[0], "EVENTS has 3 replica(s), not the 1 asked for")
	after, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, after.Config.Replicas, "an existing stream's replica count is not changed")
}

// A standalone server refuses a stream with more than 1 replica: Provision
// says so with ErrReplicasNotSupported and keeps JetStream's API error
// (10074) reachable, which start-up treats as permanent.
func TestProvisionReplicasOnStandaloneIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := forward.Provision(t.Context(), b.js, forward.StreamConfig{Name: "R3", Prefix: "r3", Replicas: 3})
	require.ErrorIs(t, err, forward.ErrReplicasNotSupported)
	require.ErrorContains(t, err, "StreamConfig.Replicas 3")
	var api *jetstream.APIError
	require.True(t, errors.As(err, &api))
	require.EqualValues(t, 10074, api.ErrorCode)
	_, err = b.js.Stream(t.Context(), "R3")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

func TestReplicasWarning(t *testing.T) {
	t.Parallel()
	require.Empty(t, forward.ReplicasWarning("EVENTS", 3, 3))
	w := forward.ReplicasWarning("EVENTS", 1, 3)
	require.Contains(t, w, "JetStream stream EVENTS has 1 replica(s), not the 3 asked for")
	require.Contains(t, w, "nats stream edit EVENTS --replicas 3")
}
