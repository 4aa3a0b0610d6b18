package deliver_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// setupSmallStore is setup on a JetStream whose file storage is capped at
// maxStore bytes (max_file_store): past it, JetStream refuses writes with
// "insufficient resources".
func setupSmallStore(t *testing.T, maxStore int64) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{MaxFileStore: maxStore}))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	return bundle{js: js, ctx: ctx}
}

// fillStore has another stream, FILLER, take what is left of the store,
// until JetStream refuses a publish for lack of storage, and returns it:
// purge it to make room.
func fillStore(t *testing.T, b bundle) jetstream.Stream {
	t.Helper()
	filler, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	pad := make([]byte, 16<<10)
	for i := 0; ; i++ {
		if _, err := b.js.Publish(b.ctx, "filler.x", pad); err != nil {
			require.True(t, forward.IsStorageFull(err), "filling the store: %v", err)
			return filler
		}
		require.Less(t, i, 1000, "the store never filled")
	}
}
