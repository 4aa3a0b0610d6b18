package deadletter_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// A dead-letter stream Provision creates keeps dead letters twice the
// events stream's MaxAge, with no size limit; none without one.
func TestProvisionFollowsTheEventsStreamsMaxAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, MaxAge: 30 * time.Second, Duplicates: 10 * time.Second})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "FOREVER", Subjects: []string{"forever.>"}})
	require.NoError(t, err)
	for _, c := range []struct {
		events, dlq, prefix string
		maxAge, dup         time.Duration
	}{
		{"EVENTS", "DLQ", "dlq", time.Minute, time.Minute},
		{"FOREVER", "DLQ2", "dlq2", 0, deadletter.DefaultDuplicateWindow},
		{"", "DLQ3", "dlq3", 0, deadletter.DefaultDuplicateWindow},
		{"MISSING", "DLQ4", "dlq4", 0, deadletter.DefaultDuplicateWindow},
	} {
		q := deadletter.New(js, deadletter.Config{Stream: c.dlq, SubjectPrefix: c.prefix, EventsStream: c.events})
		require.NoError(t, q.Provision(ctx))
		s, err := js.Stream(ctx, c.dlq)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		require.Equal(t, c.maxAge, cfg.MaxAge, c.events)
		require.Equal(t, c.dup, cfg.Duplicates, c.events)
		require.LessOrEqual(t, cfg.MaxBytes, int64(0), "%s: no size limit", c.events)
	}
}
