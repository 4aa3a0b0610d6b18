package startup_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/startup"
)

func TestReplicasWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicas int
		embedded bool
		cluster  string
		want     string // substring; "" means no warning
	}{
		{"R3 on a cluster", 3, false, "c1", ""},
		{"R1 on the embedded server", 1, true, "", ""},
		{"R1 on a standalone server", 1, false, "", "--replicas 1 on a standalone NATS server"},
		{"R1 on a cluster", 1, false, "c1", `--replicas 1 on JetStream cluster "c1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := startup.ReplicasWarning(tc.replicas, tc.embedded, tc.cluster)
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tc.want)
		})
	}
}
