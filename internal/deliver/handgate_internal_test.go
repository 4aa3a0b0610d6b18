package deliver

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// What a blocked stream keeps in hand, step by step.
func TestBlockedStreamsDrop(t *testing.T) {
	t.Parallel()
	b := newBlockedStreams()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_, drop := b.drop("s", 10, at)
	require.False(t, drop, "a stream whose head is not blocked keeps all")
	b.block("s", at)
	select {
	case <-b.changed:
	default:
		t.Fatal("blocking signals the run loop")
	}
	b.block("s", at.Add(time.Hour)) // still blocked since at
	_, drop = b.drop("s", blockedKeep-1, at)
	require.False(t, drop, "below blockedKeep in its lane: handed on")
	d, drop := b.drop("s", blockedKeep, at.Add(time.Second))
	require.True(t, drop)
	require.Equal(t, time.Second, d, "the delay is the time blocked")
	d, drop = b.drop("s", 0, at.Add(time.Millisecond))
	require.True(t, drop, "once dropping, every later event while blocked")
	require.Equal(t, blockedNakMin, d)
	d, _ = b.drop("s", 0, at.Add(time.Hour))
	require.Equal(t, blockedNakMax, d)
	require.Equal(t, map[string]time.Duration{"s": blockedNakMax}, b.startDropping(at.Add(time.Hour)))
	require.Empty(t, b.startDropping(at.Add(time.Hour)), "a lane is trimmed once per block")
	b.unblock("s")
	_, drop = b.drop("s", 10, at)
	require.False(t, drop, "settled: keeps all again")
}

// trim takes back what is queued beyond keep (the running one counted)
// and names the last one kept.
func TestLanesTrim(t *testing.T) {
	t.Parallel()
	var l lanes
	var wg sync.WaitGroup
	release := make(chan struct{})
	started := make(chan struct{})
	msgs := make([]jetstream.Msg, 6)
	for i := range msgs {
		msgs[i] = &identityMsg{n: i}
	}
	l.submit("k", msgs[0], &wg, func(jetstream.Msg) {
		select {
		case <-started:
		default:
			close(started)
		}
		<-release
	}, nil)
	<-started
	for _, m := range msgs[1:] {
		l.submit("k", m, &wg, nil, nil)
	}
	require.Equal(t, 6, l.inLane("k"))
	kept, trimmed := l.trim("k", 4)
	require.Same(t, msgs[3], kept)
	require.Equal(t, msgs[4:], trimmed)
	require.Equal(t, 4, l.inLane("k"))
	kept, trimmed = l.trim("k", 4)
	require.Nil(t, kept)
	require.Empty(t, trimmed)
	close(release)
	wg.Wait()
	require.Zero(t, l.inLane("k"))
}

// identityMsg is a message told apart by identity alone.
type identityMsg struct {
	jetstream.Msg
	n int
}
