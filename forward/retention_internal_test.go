package forward

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func TestLimitsExplainGone(t *testing.T) {
	t.Parallel()
	moved := jetstream.StreamState{FirstSeq: 40, LastSeq: 39}
	tests := []struct {
		name  string
		cfg   jetstream.StreamConfig
		state jetstream.StreamState
		want  bool
	}{
		{"no limits", jetstream.StreamConfig{MaxBytes: -1, MaxMsgs: -1}, moved, false},
		{"MaxAge, messages left the front", jetstream.StreamConfig{MaxAge: time.Hour, MaxBytes: -1, MaxMsgs: -1}, moved, true},
		{"MaxBytes, messages left the front", jetstream.StreamConfig{MaxBytes: 1 << 20, MaxMsgs: -1}, moved, true},
		{"MaxMsgs, messages left the front", jetstream.StreamConfig{MaxBytes: -1, MaxMsgs: 10}, moved, true},
		{"MaxAge, nothing left the front", jetstream.StreamConfig{MaxAge: time.Hour}, jetstream.StreamState{FirstSeq: 1, LastSeq: 5}, false},
		{"MaxMsgsPerSubject keeps each subject's last", jetstream.StreamConfig{MaxBytes: -1, MaxMsgs: -1, MaxMsgsPerSubject: 1}, moved, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, limitsExplainGone(tt.cfg, tt.state), tt.name)
	}
}

func TestLimitsString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "max_age=none max_bytes=none max_msgs_per_subject=none", Limits{}.String())
	require.Equal(t, "max_age=24h0m0s max_bytes=1024 max_msgs_per_subject=3", Limits{MaxAge: 24 * time.Hour, MaxBytes: 1024, MaxMsgsPerSubject: 3}.String())
	require.Equal(t, Limits{}, LimitsOf(jetstream.StreamConfig{MaxBytes: -1, MaxMsgsPerSubject: -1}))
}
