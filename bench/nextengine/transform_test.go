// Package nextengine holds the experiments behind docs/design/next-engine.md:
// the facts about JetStream the proposed engine depends on, checked
// against a real server (embedded, in process). They run in the full tier
// only (go test ./bench/nextengine, without -short).
package nextengine

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/wire"
)

// partitions is the partition count of the experiments (the consumer's
// default --partitions).
const partitions = 16

// partitionTransform is the subject transform the design puts on EVENTS:
// the stored subject gains a fifth token, the partition of the stream
// token.
func partitionTransform() *jetstream.SubjectTransformConfig {
	return &jetstream.SubjectTransformConfig{
		Source:      "events.*.*.*",
		Destination: "events.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(16,2)}}",
	}
}

func startServer(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

func batchOf(stream string, watermark int64, reconcile bool, evs ...event.Event) drain.Batch {
	return drain.Batch{Stream: stream, Watermark: watermark, Reconcile: reconcile, Events: evs}
}

func ev(id int64, stream string, version int64, name string) event.Event {
	return event.Event{ID: id, Stream: stream, Version: version, Name: name,
		Data: []byte(`{"n":1}`), Created: time.Now()}
}

// TestTransformPartitionsEventsUnderTheBridge: the subject transform added
// to an existing EVENTS stream partitions what the bridge publishes from
// then on, without a change to the bridge: fast batches and single
// publishes are transformed, the bridge's expected-last-subject-sequence
// fence and its reconciliation (last message on events.<cat>.<stream>.>)
// see the transformed messages, core NATS subscribers see the subject as
// published, and the partition is wire.Partition's.
func TestTransformPartitionsEventsUnderTheBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("experiment: starts a server")
	}
	js := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	prov, err := forward.Provision(ctx, js, forward.StreamConfig{Name: "EVENTS", Prefix: "events",
		DuplicateWindow: 2 * time.Minute, Replicas: 1})
	require.NoError(t, err)
	t.Logf("EVENTS provisioned by the bridge; fast batches: %v", prov.BatchPublish)

	fw, err := forward.New(js, forward.Config{Prefix: "events", Stream: "EVENTS"})
	require.NoError(t, err)

	// Before the transform: four-token subjects.
	res := fw.Handle(ctx, []drain.Batch{batchOf("order-42", -1, false,
		ev(1, "order-42", 0, "OrderPlaced"), ev(2, "order-42", 1, "OrderPaid"))})
	require.NoError(t, res[0].Err)
	require.Equal(t, 2, res[0].Done)

	// A core NATS subscriber on the published subjects.
	coreSubjects := make(chan string, 64)
	sub, err := js.Conn().Subscribe("events.>", func(m *nats.Msg) { coreSubjects <- m.Subject })
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, js.Conn().Flush())

	// Add the transform to the existing stream (a stream update).
	s, err := js.Stream(ctx, "EVENTS")
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.SubjectTransform = partitionTransform()
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err, "adding the subject transform to an existing stream")

	// After: the bridge goes on with the same stream (expected last
	// subject sequence from its own bookkeeping), a second stream starts
	// fresh, and a third is reconciled (the bridge looks up what the bus
	// holds).
	res = fw.Handle(ctx, []drain.Batch{
		batchOf("order-42", 1, false, ev(3, "order-42", 2, "OrderShipped"), ev(4, "order-42", 3, "OrderClosed")),
		batchOf("user-7", -1, false, ev(5, "user-7", 0, "UserJoined")),
	})
	for i, r := range res {
		require.NoError(t, r.Err, "batch %d", i)
	}
	fw2, err := forward.New(js, forward.Config{Prefix: "events", Stream: "EVENTS"})
	require.NoError(t, err)
	res = fw2.Handle(ctx, []drain.Batch{batchOf("order-42", 1, true,
		ev(3, "order-42", 2, "OrderShipped"), ev(4, "order-42", 3, "OrderClosed"), ev(6, "order-42", 4, "OrderArchived"))})
	require.NoError(t, res[0].Err, "reconciling a stream across the transform")
	require.Equal(t, 3, res[0].Done)

	// What is stored.
	want := map[uint64]string{
		1: "events.order.order-42.OrderPlaced",
		2: "events.order.order-42.OrderPaid",
	}
	p42 := wire.Partition("order-42", partitions)
	p7 := wire.Partition("user-7", partitions)
	t.Logf("wire.Partition: order-42 → %d, user-7 → %d", p42, p7)
	stored := map[uint64]string{}
	info, err := s.Info(ctx)
	require.NoError(t, err)
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		stored[seq] = m.Subject
	}
	t.Logf("stored: %v", stored)
	require.Equal(t, want[1], stored[1])
	require.Equal(t, want[2], stored[2])
	require.Len(t, stored, 6, "6 events stored once each (the reconcile dropped the two already there)")
	for seq := uint64(3); seq <= 6; seq++ {
		toks := strings.Split(stored[seq], ".")
		require.Len(t, toks, 5, "seq %d: %s", seq, stored[seq])
		wantP := p42
		if toks[2] == "user-7" {
			wantP = p7
		}
		require.Equal(t, wantP, mustAtoi(t, toks[4]), "seq %d: the server's partition is wire.Partition's", seq)
	}

	// Core subscribers saw the subjects as published (four tokens).
	var core []string
	for len(core) < 4 {
		select {
		case s := <-coreSubjects:
			core = append(core, s)
		case <-time.After(2 * time.Second):
			t.Fatalf("core subscriber saw %v, want 4 publishes", core)
		}
	}
	t.Logf("core NATS subscriber saw: %v", core)
	for _, s := range core {
		require.Len(t, strings.Split(s, "."), 4, s)
	}

	// Filters: by category and by stream keep matching old and new
	// messages; by name only the old ones; the partition filter only new
	// ones of its partition.
	count := func(filters ...string) int {
		c, err := js.OrderedConsumer(ctx, "EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: filters})
		require.NoError(t, err)
		n := 0
		for {
			m, err := c.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) {
				return n
			}
			require.NoError(t, err)
			_ = m
			n++
		}
	}
	require.Equal(t, 5, count("events.order.>"), "category filter")
	require.Equal(t, 5, count("events.order.order-42.>"), "stream filter")
	require.Equal(t, 1, count("events.*.*.OrderPlaced"), "name filter: the old message only")
	require.Equal(t, 1, count("events.*.*.OrderShipped.*"), "name filter with the partition token")
	require.Equal(t, 6, count("events.*.*.*", "events.*.*.*.*"), "any name, both forms: every event")
	inP42 := 3 // order-42's events 3, 4 and 6
	if p7 == p42 {
		inP42++
	}
	require.Equal(t, inP42, count("events.*.*.*."+strconv.Itoa(p42)), "partition filter")
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
