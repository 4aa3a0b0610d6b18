package reader

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/wire"
)

// A catch-up whose target the stream does not reach (as when every
// replica answering the direct gets lags) reads again ShortReads times,
// then says so with ErrBehind and leaves the catch-up where it was.
func TestACatchUpThatNeverReachesItsTargetSaysItIsBehind(t *testing.T) {
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
	for k := range 10 {
		_, err := js.Publish(t.Context(), wire.Subject(wire.DefaultEventsPrefix, fmt.Sprintf("c-%d", k), "Happened"), []byte(`{}`))
		require.NoError(t, err)
	}
	r, err := Open(t.Context(), js, Config{ShortReads: 2}, 1)
	require.NoError(t, err)
	t.Cleanup(r.Stop)
	for p := range r.owned {
		r.owned[p] = true
	}
	r.catch.add(0, 0, 20) // a head the stream never reached: the answers stop at 10

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []uint64
	for {
		ev, err := r.Next(ctx)
		if err != nil {
			require.True(t, errors.Is(err, ErrBehind), "%v", err)
			break
		}
		got = append(got, ev.Seq)
	}
	for _, seq := range got {
		require.LessOrEqual(t, seq, uint64(10))
	}
	require.Equal(t, uint64(11), r.catch.next, "the catch-up stays where it was")
}
