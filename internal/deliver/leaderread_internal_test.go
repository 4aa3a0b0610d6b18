package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// The copy the look-ups read: order-1's versions 0..3 at sequences 1, 3,
// 4, 5 (two event names), order-2's version 0 at 2.
var lookupEvents = []struct {
	subject string
	version int
}{
	{"ordered.events.0.order.order-1.OrderPlaced", 0},
	{"ordered.events.0.order.order-2.OrderPlaced", 0},
	{"ordered.events.0.order.order-1.OrderNoted", 1},
	{"ordered.events.0.order.order-1.OrderPlaced", 2},
	{"ordered.events.0.order.order-1.OrderNoted", 3},
}

const lookupKey = "ordered.events.0.order.order-1"

// lookupCopy creates stream COPY (replicas, direct gets allowed or not)
// holding lookupEvents.
func lookupCopy(t *testing.T, js jetstream.JetStream, replicas int, allowDirect bool) {
	t.Helper()
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "COPY", Subjects: []string{"ordered.events.>"}, Replicas: replicas, AllowDirect: allowDirect})
	require.NoError(t, err)
	for _, e := range lookupEvents {
		m := nats.NewMsg(e.subject)
		m.Header.Set(wire.HeaderStreamVersion, strconv.Itoa(e.version))
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
}

// countRequests counts the requests published on subject (a spy: it
// answers nothing).
func countRequests(t *testing.T, nc *nats.Conn, subject string) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	sub, err := nc.Subscribe(subject, func(*nats.Msg) { n.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return &n
}

// lookupSuccessors is a partition's successor check reading COPY through
// js, with the partition consumer's filter on partition 0's order
// category.
func lookupSuccessors(t *testing.T, js jetstream.JetStream) *successors {
	t.Helper()
	sc := newSuccessors(t.Context(), clockwork.NewFakeClock(), slog.New(slog.DiscardHandler), newHandBook(), nil,
		[]string{"ordered.events.0.order.>"}, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, "COPY") },
		func(string) uint64 { return 0 })
	sc.js = js
	return sc
}

// A lagging follower answering the version chain's direct get (here a
// responder that has the copy up to sequence 3 only, or none of it; the
// copy itself answers no direct get) names an older predecessor: the
// stream leader's answer replaces it, so the look-up names what the
// leader has. The successor check never asks a direct get: the message
// get API, which only the stream's leader answers.
func TestLookUpsReadWhatTheStreamLeaderHas(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	nc := js.Conn()
	lookupCopy(t, js, 1, false)
	ctx := t.Context()

	var has atomic.Uint64 // the follower's last sequence
	follower, err := nc.Subscribe(jsapi.DirectGetSubject(js, "COPY"), func(req *nats.Msg) {
		n := has.Load()
		if n == 0 {
			_ = req.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"404"}}})
			return
		}
		// The last message it has: what a multi_last up_to_seq answers
		// when only the stream's first n messages arrived.
		e := lookupEvents[n-1]
		_ = req.RespondMsg(&nats.Msg{Data: []byte("{}"), Header: nats.Header{
			jetstream.SequenceHeader: []string{strconv.FormatUint(n, 10)}, jetstream.SubjectHeader: []string{e.subject},
			wire.HeaderStreamVersion: []string{strconv.Itoa(e.version)},
		}})
		_ = req.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"204"}}})
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = follower.Unsubscribe() })
	leader := countRequests(t, nc, jsapi.Subject(js, "STREAM.MSG.GET.COPY"))
	subjects := []string{lookupKey + ".*"}

	for _, n := range []uint64{3, 0} {
		has.Store(n)
		v, found, err := deadletter.LastVersionBefore(ctx, js, "COPY", subjects, 0, 5)
		require.NoError(t, err)
		require.True(t, found, "the follower has %d messages", n)
		require.Equal(t, int64(2), v, "the follower has %d messages: the leader's predecessor of sequence 5 is version 2 at 4, not the follower's", n)
	}
	require.Positive(t, leader.Load(), "the leader was asked")

	has.Store(1)
	v, found, err := deadletter.LastVersionBefore(ctx, js, "COPY", subjects, 0, 3)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(0), v, "a right answer is confirmed: order-1's version 0 comes before sequence 3")

	_, found, err = deadletter.LastVersionBefore(ctx, js, "COPY", subjects, 0, 1)
	require.NoError(t, err)
	require.False(t, found, "nothing before a stream's first event")
}

// The successor check asks the stream leader's message get API even when
// the copy allows direct gets (which nats.go's Stream.GetMsg would take,
// answered by any replica 90 % caught up), and names the stream's next
// event across event names, or none.
func TestSuccessorLookUpAsksTheStreamLeader(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	nc := js.Conn()
	lookupCopy(t, js, 1, true)
	direct := countRequests(t, nc, jsapi.DirectGetSubject(js, "COPY"))
	leader := countRequests(t, nc, jsapi.Subject(js, "STREAM.MSG.GET.COPY"))
	sc := lookupSuccessors(t, js)

	for after, want := range map[uint64]uint64{0: 1, 1: 3, 3: 4, 4: 5, 5: 0} {
		next, err := sc.successorSeq(lookupKey, after)
		require.NoError(t, err)
		require.Equal(t, want, next, "order-1's first event after sequence %d", after)
	}
	require.Eventually(t, func() bool { return leader.Load() == 5 }, 5*time.Second, time.Millisecond, "one message get a look-up")
	require.Zero(t, direct.Load(), "no direct get")
}

// On a 3-node cluster, connected to a node that does not lead the copy,
// both look-ups answer what the copy's leader has.
func TestLookUpsOnAClusterAnswerFromTheLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster")
	}
	t.Parallel()
	c, err := embedded.StartCluster(embedded.ClusterConfig{Nodes: 3, Name: "lookup", Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(c.Shutdown)
	cnc, err := c.Connect()
	require.NoError(t, err)
	t.Cleanup(cnc.Close)
	js, err := jetstream.New(cnc)
	require.NoError(t, err)
	lookupCopy(t, js, 3, true)
	leaderNode := c.StreamLeader("COPY")
	require.NotNil(t, leaderNode)
	var follower *embedded.Node
	for _, n := range c.Nodes() {
		if n != leaderNode {
			follower = n
		}
	}
	nc, err := nats.Connect(follower.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	fjs, err := jetstream.New(nc)
	require.NoError(t, err)

	v, found, err := deadletter.LastVersionBefore(t.Context(), fjs, "COPY", []string{lookupKey + ".*"}, 0, 5)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(2), v)
	sc := lookupSuccessors(t, fjs)
	next, err := sc.successorSeq(lookupKey, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(3), next, fmt.Sprintf("asked through %s", follower.Name()))
}
