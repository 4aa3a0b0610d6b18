package reader

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/wire"
)

// A catch-up whose target the stream does not reach (its events removed
// since the head passed them) reads again ShortReads times, then asks the
// leader, whose answer ends it: every event there is handed on once, and
// nothing is waited for.
func TestACatchUpPastWhatTheStreamHoldsEndsWhereTheLeaderSays(t *testing.T) {
	t.Parallel()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.DefaultEventsStream,
		Subjects: []string{wire.All(wire.DefaultEventsPrefix)}, AllowDirect: true})
	require.NoError(t, err)
	want := map[uint64]bool{}
	for k := range 10 {
		ack, err := js.Publish(t.Context(), wire.Subject(wire.DefaultEventsPrefix, fmt.Sprintf("c-%d", k), "Happened"), []byte(`{}`))
		require.NoError(t, err)
		want[ack.Sequence] = true
	}
	r, err := Open(t.Context(), js, Config{ShortReads: 2}, 1)
	require.NoError(t, err)
	t.Cleanup(r.Stop)
	for p := range r.owned {
		r.owned[p] = true
		r.catch.add(p, 0, 20) // a head past what the stream holds: the answers stop at 10
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := map[uint64]bool{}
	for {
		ev, ok, _, err := r.nextCaughtUp(ctx)
		require.NoError(t, err)
		if !ok {
			break
		}
		require.False(t, got[ev.Seq], "seq %d twice", ev.Seq)
		got[ev.Seq] = true
	}
	require.Equal(t, want, got)
	require.Empty(t, r.catch.after, "the catch-up ended")
	require.Equal(t, uint64(21), r.catch.scan.next)
}
