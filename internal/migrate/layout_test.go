package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/migrate/migratetest"
	"github.com/jsbridge/jsbridge/wire"
)

// The old layout, built through the JetStream API alone as the old engine
// left it (migratetest).

// partitions is the old layout's partition count in these tests.
const partitions = 4

// oldLayout is an embedded server holding the old layout, and what the
// tests know of it.
type oldLayout struct {
	*migratetest.Layout
	js jetstream.JetStream
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
		if wire.StreamPartition(s, partitions) == p && !slices.Contains(taken, s) {
			return s
		}
	}
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
	events, err := l.js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
	require.NoError(t, err)
	for i := range 5 {
		l.publish(t, fmt.Sprintf("old-%d", i), 0)
	}
	require.NoError(t, events.Purge(ctx))
	l.Layout, err = migratetest.New(ctx, l.js, migratetest.Config{Partitions: partitions, Epoch: 118})
	require.NoError(t, err)
	l.seq = map[string][]uint64{}
	for _, s := range []string{l.a, l.b, l.c, l.a, l.b, l.a, l.b, l.c, l.a} {
		l.publish(t, s, len(l.seq[s]))
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, l.WaitCopied(wctx), "the copy sources the nine events")
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

// eventsKey is a stream's key on the events stream (wire.StreamKey of
// its subjects).
func eventsKey(stream string) string {
	return wire.StreamKey(wire.Subject(wire.DefaultEventsPrefix, stream, "Happened"))
}

// copyKey is a stream's key on the copy, read from its first event there.
func (l *oldLayout) copyKey(t *testing.T, stream string) string {
	t.Helper()
	m, err := l.Copy.GetMsg(context.Background(), l.copySeq(stream, 0))
	require.NoError(t, err)
	return wire.StreamKey(m.Subject)
}

// outcomes is a migratetest outcome function: each event id's outcome
// as listed, def for the others.
func outcomes(def migratetest.Outcome, byID map[string]migratetest.Outcome) func(migratetest.Event) migratetest.Outcome {
	return func(ev migratetest.Event) migratetest.Outcome {
		if o, ok := byID[ev.ID]; ok {
			return o
		}
		return def
	}
}

// bySeq is a migratetest outcome function for an unordered durable: the
// events at the sequences in accepted Accepted, the others def.
func bySeq(def migratetest.Outcome, accepted ...uint64) func(migratetest.Event) migratetest.Outcome {
	return func(ev migratetest.Event) migratetest.Outcome {
		if slices.Contains(accepted, ev.Seq) {
			return migratetest.Accepted
		}
		return def
	}
}
