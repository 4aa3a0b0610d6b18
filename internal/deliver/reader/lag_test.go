package reader_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// lagMirror is the name of the mirror that plays a lagging replica.
const lagMirror = "EVENTS_LAGGING"

// lagging makes a replica that holds only the events stream's first n
// messages (n its current count) answer direct gets of the stream: a
// mirror of it (R1), which answers its origin's direct gets when the
// origin allows them (nats-server stream.go subscribeToMirrorDirect, in
// the same queue group as the origin's replicas) and is sealed once it
// holds the n: it takes no more. With alone, EVENTS itself stops
// answering them (AllowDirect turned off after the mirror inherited it),
// so that every direct get is answered by the lagging mirror: what a
// follower behind the leader answers, made deterministic. Only the
// leader's message get knows the rest. It returns a count of the
// message gets asked of the leader, and the server the mirror is on
// (requests go to the queue group's members on the requester's server
// first).
func lagging(t *testing.T, js jetstream.JetStream, alone bool) (leaderGets *atomic.Int64, host string) {
	t.Helper()
	ctx := t.Context()
	events, err := js.Stream(ctx, wire.DefaultEventsStream)
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	n := info.State.Msgs
	require.True(t, info.Config.AllowDirect)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: lagMirror, Mirror: &jetstream.StreamSource{Name: wire.DefaultEventsStream}})
	require.NoError(t, err)
	mirror, err := js.Stream(ctx, lagMirror)
	require.NoError(t, err)
	var mi *jetstream.StreamInfo
	require.Eventually(t, func() bool {
		mi, err = mirror.Info(ctx)
		return err == nil && mi.State.Msgs == n
	}, 10*time.Second, 20*time.Millisecond, "the mirror holds the first %d messages", n)
	require.True(t, mi.Config.MirrorDirect)
	sealed := mi.Config
	sealed.Sealed = true
	_, err = js.UpdateStream(ctx, sealed)
	require.NoError(t, err)
	if mi.Cluster != nil {
		host = mi.Cluster.Leader
	}
	if alone {
		cfg := info.Config
		cfg.AllowDirect = false
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	leaderGets = &atomic.Int64{}
	sub, err := js.Conn().Subscribe("$JS.API.STREAM.MSG.GET."+wire.DefaultEventsStream, func(*nats.Msg) { leaderGets.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, js.Conn().Flush())
	return leaderGets, host
}

// Every direct get answered by a replica that lacks the stream's newer
// events: a cursor reads on past what it holds from the leader, every
// event of its filter once, in order, up to its target.
func TestACursorReadsPastALaggingReplicaFromTheLeader(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	s := stored{}
	publishMixed(t, b.js, s, 100)
	leaderGets, _ := lagging(t, b.js, true)
	publishMixed(t, b.js, s, 100)
	to := uint64(len(s))

	c, err := reader.NewCursor(b.js, reader.Config{Batch: 8}, []string{"events.a.>", "events.b.b-1.>"}, 1, to)
	require.NoError(t, err)
	require.Equal(t, s.want(1, to, "events.a.>", "events.b.b-1.>"), drain(t, c, s))
	require.Positive(t, leaderGets.Load(), "what the replica lacked came from the leader")
}

// The catch-up of a partition taken below the head, every direct get
// answered by a replica that lacks the newer events: it reads them from
// the leader and hands on every event of the partition once, in order,
// then the live ones.
func TestACatchUpReadsPastALaggingReplicaFromTheLeader(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.publish(t, 100)
	leaderGets, _ := lagging(t, b.js, true)
	b.publish(t, 100)
	r := open(t, b, reader.Config{Batch: 16}, 1)
	require.NoError(t, r.Take(0, 0))
	next(t, r, len(b.seqs(0, 0, b.last())))
	h := r.Head()

	require.NoError(t, r.Take(1, 0))
	b.publish(t, 20)
	evs := next(t, r, len(b.seqs(1, 0, b.last()))+len(b.seqs(0, h, b.last())))
	require.Equal(t, map[int][]uint64{0: b.seqs(0, h, b.last()), 1: b.seqs(1, 0, b.last())}, byPartition(evs))
	require.Positive(t, leaderGets.Load(), "what the replica lacked came from the leader")
}

// A read that its replicas answer short and whose leader does not answer
// (here the stream is gone, its lagging mirror still answering direct
// gets) says so with ErrBehind, and stays where it was.
func TestAReadTheLeaderDoesNotAnswerIsBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	s := stored{}
	publishMixed(t, b.js, s, 30)
	lagging(t, b.js, true)
	publishMixed(t, b.js, s, 30)
	to := uint64(len(s))
	c, err := reader.NewCursor(b.js, reader.Config{ReadTimeout: 2 * time.Second}, []string{"events.>"}, 1, to)
	require.NoError(t, err)
	require.NoError(t, b.js.DeleteStream(t.Context(), wire.DefaultEventsStream))

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var got []uint64
	for {
		ev, err := c.Next(ctx)
		if err != nil {
			require.True(t, errors.Is(err, reader.ErrBehind), "%v", err)
			break
		}
		got = append(got, ev.Seq)
	}
	require.Equal(t, s.want(1, 31, "events.>"), got, "what the replica held, then nothing")
	_, err = c.Next(ctx)
	require.ErrorIs(t, err, reader.ErrBehind, "asked again, the same")
}
