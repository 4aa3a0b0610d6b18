package migrate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/wire"
)

// The old layout, built through the JetStream API alone as the old engine
// leaves it (its exported encoders where it has them: wire's records,
// deadletter's park entries, skipped versions and dead letters,
// ordercopy's copy).

// partitions is the old layout's partition count in these tests.
const partitions = 4

// oldLayout is an embedded server holding the old layout, and what the
// tests know of it.
type oldLayout struct {
	js     jetstream.JetStream
	events jetstream.Stream
	copy   jetstream.Stream
	park   jetstream.KeyValue
	// streams by partition: two of partition 0 (a, b), one of 1 (c).
	a, b, c string
	// seq is each published event's events stream sequence, by stream
	// and version.
	seq map[string][]uint64
}

// startServer starts an embedded JetStream server until cleanup.
func startServer(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir(), Port: embedded.RandomPort})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// streamIn returns the first stream name "order-<n>" in partition p that
// is not in taken.
func streamIn(p int, taken ...string) string {
	for n := 0; ; n++ {
		s := "order-" + strconv.Itoa(n)
		if wire.StreamPartition(s, partitions) == p && !contains(taken, s) {
			return s
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// newOldLayout makes the events stream with five events purged before the
// copy was made (so the copy's sequence c is the events stream's c+5),
// the copy (partitioned for 4), and publishes a0 b0 c0 a1 b1 a2 b2 c1 a3
// (events 6–14, copy 1–9); the park bucket holds the lease epoch 118.
func newOldLayout(t *testing.T) *oldLayout {
	t.Helper()
	ctx := context.Background()
	l := &oldLayout{js: startServer(t), seq: map[string][]uint64{}}
	l.a = streamIn(0)
	l.b = streamIn(0, l.a)
	l.c = streamIn(1)
	var err error
	l.events, err = l.js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
	require.NoError(t, err)
	for i := range 5 {
		l.publish(t, fmt.Sprintf("old-%d", i), 0)
	}
	require.NoError(t, l.events.Purge(ctx))
	_, err = ordercopy.Provision(ctx, l.js, l.events, partitions, 1, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	l.seq = map[string][]uint64{}
	for _, s := range []string{l.a, l.b, l.c, l.a, l.b, l.a, l.b, l.c, l.a} {
		l.publish(t, s, len(l.seq[s]))
	}
	l.copy, err = l.js.Stream(ctx, wire.OrderedStream(wire.DefaultEventsStream))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := l.copy.Info(ctx)
		return err == nil && info.State.LastSeq == 9
	}, 10*time.Second, 10*time.Millisecond, "the copy sources the nine events")
	l.park, err = l.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	_, err = l.park.Put(ctx, wire.EpochKey, []byte("118"))
	require.NoError(t, err)
	return l
}

// publish stores version v of stream (event id "<stream>/<v>").
func (l *oldLayout) publish(t *testing.T, stream string, v int) {
	t.Helper()
	m := nats.NewMsg(wire.Subject(wire.DefaultEventsPrefix, stream, "Happened"))
	m.Header.Set(wire.HeaderMsgID, eventID(stream, v))
	m.Header.Set(wire.HeaderStreamVersion, strconv.Itoa(v))
	ack, err := l.js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	l.seq[stream] = append(l.seq[stream], ack.Sequence)
}

func eventID(stream string, v int) string { return stream + "/" + strconv.Itoa(v) }

// copySeq is the copy sequence of version v of stream.
func (l *oldLayout) copySeq(stream string, v int) uint64 { return l.seq[stream][v] - 5 }

// eventsKey and copyKey are a stream's keys on the events stream and on
// the copy (wire.StreamKey of its subjects).
func eventsKey(stream string) string {
	return wire.StreamKey(wire.Subject(wire.DefaultEventsPrefix, stream, "Happened"))
}

func copyKey(stream string) string {
	return wire.OrderedPrefix(wire.DefaultEventsPrefix) + "." + strconv.Itoa(wire.StreamPartition(stream, partitions)) + "." +
		wire.EscapeToken(wire.Category(stream)) + "." + wire.EscapeToken(stream)
}

// partitionConsumers makes sub's partition consumers on the copy, as the
// old engine's consumerConfig does (filter, explicit acks), and returns
// them by partition.
func (l *oldLayout) partitionConsumers(t *testing.T, sub string) []jetstream.Consumer {
	t.Helper()
	out := make([]jetstream.Consumer, partitions)
	for p := range partitions {
		filter, err := wire.OrderedFilter(wire.DefaultEventsPrefix, p, wire.All(wire.DefaultEventsPrefix))
		require.NoError(t, err)
		out[p], err = l.js.CreateConsumer(context.Background(), wire.OrderedStream(wire.DefaultEventsStream), jetstream.ConsumerConfig{
			Durable: wire.PartitionDurable(sub, p), FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour, MaxDeliver: -1,
		})
		require.NoError(t, err)
	}
	return out
}

// take fetches n messages from c and acks those whose stream sequence is
// in ack (double acks: the floor is read right after), returning them.
func take(t *testing.T, c jetstream.Consumer, n int, ack ...uint64) []jetstream.Msg {
	t.Helper()
	batch, err := c.FetchNoWait(n)
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
		md, err := m.Metadata()
		require.NoError(t, err)
		for _, s := range ack {
			if s == md.Sequence.Stream {
				require.NoError(t, m.DoubleAck(context.Background()))
			}
		}
	}
	require.NoError(t, batch.Error())
	require.Len(t, msgs, n)
	return msgs
}

// putJSON stores v as JSON under key in the park bucket.
func (l *oldLayout) putJSON(t *testing.T, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	_, err = l.park.Put(context.Background(), key, b)
	require.NoError(t, err)
}

// deadLetter stores the dead letter of version v of stream for sub, as
// the old engine's head of line does (the message as on the events
// stream: its subject and sequence).
func (l *oldLayout) deadLetter(t *testing.T, sub, stream string, v int, previous string) {
	t.Helper()
	ctx := context.Background()
	q := deadletter.New(l.js, deadletter.Config{})
	require.NoError(t, q.Provision(ctx))
	oc, err := l.js.OrderedConsumer(ctx, wire.DefaultEventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.StreamFilter(wire.DefaultEventsPrefix, stream)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: l.seq[stream][v],
	})
	require.NoError(t, err)
	m, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err)
	require.NoError(t, q.DeadLetter(ctx, deadletter.Letter{Subscription: sub, EventID: eventID(stream, v), Msg: m, Reason: "HTTP 422", Previous: previous}))
}
