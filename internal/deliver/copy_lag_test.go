package deliver_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/wire"
)

// A copy every message of which aged out (its MaxAge passed) is caught
// up, not behind by the whole events stream: its lag reads 0. With the
// store full and events held out of it meanwhile, its lag is those events.
func TestCopyLagOfACopyWhoseEveryMessageAgedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the copy's messages to age out")
	}
	t.Parallel()
	b := &orderedBundle{bundle: setupSmallStore(t, 2<<20), events: map[string]orderedEvent{}, nextID: 1}
	copyName := wire.OrderedStream("EVENTS")
	s, err := b.js.CreateStream(b.ctx, copyConfig(4, time.Second))
	require.NoError(t, err)
	b.publishStream(t, "order-1", 0, 5)
	require.Eventually(t, func() bool {
		info, err := s.Info(b.ctx)
		return err == nil && info.State.LastSeq == 5 && info.State.Msgs == 0
	}, 15*time.Second, 20*time.Millisecond, "five messages sourced into the copy, then aged out of it")

	lag, err := inspect.ReadCopyLag(b.ctx, b.js, "EVENTS", time.Now())
	require.NoError(t, err)
	require.Equal(t, inspect.CopyLag{Stream: copyName, Events: "EVENTS", Sourced: 5}, lag, "caught up")

	// Three events held out of the copy, the store filled, the sourcing
	// back: the copy is refused, and its lag is the three.
	cfg := s.CachedInfo().Config
	sources := cfg.Sources
	cfg.Sources = nil
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	b.publishStream(t, "order-1", 5, 8)
	filler := fillStore(t, b.bundle)
	cfg.Sources = sources
	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		lag, err = inspect.ReadCopyLag(b.ctx, b.js, "EVENTS", time.Now())
		return err == nil && lag.Messages == 3 && lag.Sourced == 5 && lag.Age > 0
	}, 15*time.Second, 100*time.Millisecond, "three events not sourced")

	require.NoError(t, filler.Purge(b.ctx))
	require.Eventually(t, func() bool {
		lag, err = inspect.ReadCopyLag(b.ctx, b.js, "EVENTS", time.Now())
		return err == nil && lag.Messages == 0 && lag.Sourced == 8
	}, 15*time.Second, 20*time.Millisecond, "caught up again")
}
