package startup_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/startup"
)

func TestReplicasWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicas int
		server   string
		cluster  string
		want     string // substring; "" means no warning
	}{
		{"R3 on a cluster", 3, "n1", "c1", ""},
		{"R1 on the embedded server", 1, embedded.ServerName, "", ""},
		{"R1 on a standalone server", 1, "nats-1", "", "--stream-replicas 1 on a standalone NATS server"},
		{"R1 on a cluster", 1, "n1", "c1", `--stream-replicas 1 on JetStream cluster "c1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := startup.ReplicasWarning(tc.replicas, tc.server, tc.cluster)
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tc.want)
		})
	}
}

func TestMemoryStorageWarning(t *testing.T) {
	t.Parallel()
	require.Empty(t, startup.MemoryStorageWarning("DLQ", "dead letters", jetstream.FileStorage))
	got := startup.MemoryStorageWarning("DLQ", "dead letters", jetstream.MemoryStorage)
	require.Contains(t, got, "JetStream stream DLQ uses memory storage: its dead letters are lost when the NATS server restarts")
}
