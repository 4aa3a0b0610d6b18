// Package nextengine holds the experiments behind docs/design/next-engine.md:
// the facts about JetStream the proposed engine depends on, checked
// against a real server (embedded, in process). They are measurements, not
// part of make test: they run when asked,
//
//	NEXTENGINE=1 go test -count=1 -v ./bench/nextengine
//
// (NEXTENGINE_DURABLES, default 200, and NEXTENGINE_IDLE, default 20s,
// size the cluster experiment; NEXTENGINE_RATE, default 1000 events/s,
// NEXTENGINE_WINDOW, default 20s, NEXTENGINE_ROUNDS, default 2, and
// NEXTENGINE_BACKLOG, default 30000 events, size E7, and
// NEXTENGINE_PROFILES, a directory, keeps its CPU profiles).
package nextengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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

// experiment skips t unless the experiments were asked for (NEXTENGINE=1),
// and always under -short: they start servers and clusters and measure for
// minutes.
func experiment(t *testing.T) {
	t.Helper()
	if testing.Short() || os.Getenv("NEXTENGINE") == "" {
		t.Skip("an experiment of docs/design/next-engine.md: NEXTENGINE=1 runs it")
	}
}

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
	experiment(t)
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

// directBatch sends one batched direct get and returns the messages it
// answered, up to the end-of-batch status (204) or a not-found (404).
func directBatch(nc *nats.Conn, stream string, req map[string]any) ([]*nats.Msg, error) {
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, err
	}
	var out []*nats.Msg
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			return out, err
		}
		switch m.Header.Get("Status") {
		case "":
			out = append(out, m)
		case "204", "404":
			return out, nil
		default:
			return out, fmt.Errorf("direct get: %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
	}
}

// TestCursorReadsItsOwnEventsByDirectGet: a cursor of a subscription
// filtered by category reads, on a partitioned EVENTS, exactly its own
// events of one partition, in order, with batched direct gets filtered
// by subject on the server (events.<cat>.*.*.<p>), whatever else the
// partition holds.
func TestCursorReadsItsOwnEventsByDirectGet(t *testing.T) {
	experiment(t)
	js := startServer(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"},
		Storage: jetstream.FileStorage, SubjectTransform: partitionTransform(), AllowDirect: true})
	require.NoError(t, err)

	// 20,000 events: 100 categories of 20 streams, 10 events each,
	// interleaved as live traffic is.
	const categories, streams, each = 100, 20, 10
	acked := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatal("publishes not acknowledged")
		}
	}
	for range each {
		for c := range categories {
			for k := range streams {
				_, err := js.PublishAsync(fmt.Sprintf("events.m%d.m%d-%d.Pinged", c, c, k), []byte(`{}`))
				require.NoError(t, err)
			}
			acked() // 20 at a time: under the client's limit of outstanding publishes
		}
	}

	// The cursor: category m7 on the partition of stream m7-0.
	p := wire.Partition("m7-0", partitions)
	var want []string
	for k := range streams {
		if s := fmt.Sprintf("m7-%d", k); wire.Partition(s, partitions) == p {
			want = append(want, s)
		}
	}
	filter := fmt.Sprintf("events.m7.*.*.%d", p)
	var got []uint64
	seen := map[string]int{}
	reads := 0
	t0 := time.Now()
	for from := uint64(1); ; {
		msgs, err := directBatch(js.Conn(), "EVENTS", map[string]any{"seq": from, "next_by_subj": filter, "batch": 64})
		require.NoError(t, err)
		reads++
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			require.NoError(t, err)
			toks := strings.Split(m.Header.Get("Nats-Subject"), ".")
			require.Len(t, toks, 5)
			require.Equal(t, "m7", toks[1])
			require.Equal(t, strconv.Itoa(p), toks[4])
			seen[toks[2]]++
			got = append(got, seq)
			from = seq + 1
		}
	}
	took := time.Since(t0)
	require.Len(t, got, len(want)*each, "every event of the category in the partition, once")
	for i := 1; i < len(got); i++ {
		require.Less(t, got[i-1], got[i], "in stream order")
	}
	for _, s := range want {
		require.Equal(t, each, seen[s], s)
	}
	t.Logf("cursor %s over 20,000 events: %d events of %d streams in %d batched direct gets, %v",
		filter, len(got), len(want), reads, took.Round(time.Microsecond))

	// What a catch-up read costs per event: a cursor over the whole
	// partition (every category), batches of 256; CPU of the process
	// (server and client).
	all := fmt.Sprintf("events.*.*.*.%d", p)
	n, reads := 0, 0
	c0, w0 := cpu(), time.Now()
	for from := uint64(1); ; {
		msgs, err := directBatch(js.Conn(), "EVENTS", map[string]any{"seq": from, "next_by_subj": all, "batch": 256})
		require.NoError(t, err)
		reads++
		if len(msgs) == 0 {
			break
		}
		n += len(msgs)
		last, err := strconv.ParseUint(msgs[len(msgs)-1].Header.Get("Nats-Sequence"), 10, 64)
		require.NoError(t, err)
		from = last + 1
	}
	used, wall := cpu()-c0, time.Since(w0)
	t.Logf("cursor %s: %d events in %d batched direct gets, %v, CPU %.1f µs per event (server and client)",
		all, n, reads, wall.Round(time.Microsecond), float64(used.Microseconds())/float64(n))

	// The same events through an R1 ordered consumer of the cursor's own
	// (created for it). Its last fetch waits for more; the CPU is what
	// counts.
	c0, w0 = cpu(), time.Now()
	oc, err := js.OrderedConsumer(ctx, "EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{all}})
	require.NoError(t, err)
	m := 0
	for m < n {
		batch, err := oc.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for range batch.Messages() {
			m++
		}
		require.NoError(t, batch.Error())
	}
	used, wall = cpu()-c0, time.Since(w0)
	t.Logf("the same %d events through an ordered consumer (created for the read): %v, CPU %.1f µs per event (server and client)",
		m, wall.Round(time.Microsecond), float64(used.Microseconds())/float64(m))
}

// TestTransformIngestCost: what the partition transform costs on ingest.
// 100,000 async publishes (256 B, 10,000 streams) into a file stream with
// and without the transform, alternating three times; CPU of the process
// (server and client) per message.
func TestTransformIngestCost(t *testing.T) {
	experiment(t)
	js := startServer(t)
	ctx := context.Background()
	body := make([]byte, 256)
	run := func(name string, tr *jetstream.SubjectTransformConfig) float64 {
		_ = js.DeleteStream(ctx, "EVENTS")
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"},
			Storage: jetstream.FileStorage, SubjectTransform: tr})
		require.NoError(t, err)
		const n = 100_000
		c0, w0 := cpu(), time.Now()
		for i := range n {
			for {
				_, err := js.PublishAsync(fmt.Sprintf("events.c%d.c%d-%d.Happened", i%100, i%100, i%10_000), body)
				if err == nil {
					break
				}
				<-js.PublishAsyncComplete() // stalled: let the outstanding ones be acknowledged
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			t.Fatal("publishes not acknowledged")
		}
		used, wall := cpu()-c0, time.Since(w0)
		per := float64(used.Nanoseconds()) / n / 1000
		t.Logf("%s: %.0f msg/s, CPU %.1f µs per message (server and client)", name, n/wall.Seconds(), per)
		return per
	}
	var without, with float64
	for range 3 {
		without += run("without the transform", nil)
		with += run("with the transform", partitionTransform())
	}
	t.Logf("with ÷ without, CPU per message over three rounds: %.2f", with/without)
}
