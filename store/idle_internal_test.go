package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A request to a listener whose loop has ended is answered with
// ErrNotListening, whether the loop ended before the request was sent or
// after it was queued and never taken (the request waited for ever before
// the listener had done).
func TestAskAnsweredOnceTheLoopHasEnded(t *testing.T) {
	t.Parallel()
	ended := newListener()
	close(ended.done)
	_, err := ended.ask(t.Context(), false)
	require.ErrorIs(t, err, ErrNotListening)

	l := newListener()
	go func() {
		// End the loop once the request is queued, without taking it.
		for len(l.reqs) == 0 {
			time.Sleep(time.Millisecond)
		}
		close(l.done)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = l.ask(ctx, true)
	require.ErrorIs(t, err, ErrNotListening, "a queued request not taken before the loop ended")
}
