package inspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// TraceEvent reads where an event stands for each subscription whose
// filter takes it, from the durable consumers as the consumer makes them
// (an unordered one on EVENTS, an ordered one's partitions on the
// partitioned copy) and an ordered partition's delivered record: pending
// before its consumer delivered it; outstanding when delivered with acks
// pending above the ack floor (here, acked out of order or not at all);
// settled by the delivered record (of this copy only) or the ack floor.
func TestTraceReadsWhereEachSubscriptionStands(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	events, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.DefaultEventsStream, Subjects: []string{wire.All(wire.DefaultEventsPrefix)}})
	require.NoError(t, err)
	const partitions = 4
	_, err = ordercopy.Provision(ctx, js, events, partitions, 1, slog.New(slog.DiscardHandler))
	require.NoError(t, err)

	// Two streams of one partition: events 1 (order-1) and 2.
	p := wire.StreamPartition("order-1", partitions)
	other := ""
	for i := 2; other == ""; i++ {
		if s := fmt.Sprintf("order-%d", i); wire.StreamPartition(s, partitions) == p {
			other = s
		}
	}
	for i, stream := range []string{"order-1", other} {
		e := event.Event{ID: int64(i + 1), Stream: stream, Version: 0, Name: "OrderPlaced", Data: []byte(`{}`), Created: time.Now()}
		_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
		require.NoError(t, err)
	}
	cp, err := js.Stream(ctx, wire.OrderedStream(wire.DefaultEventsStream))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cp.Info(ctx)
		return err == nil && info.State.Msgs == 2
	}, 10*time.Second, 10*time.Millisecond, "both events in the copy")

	// The subscriptions' durables as the consumer makes them: "ledger"
	// ordered (one per partition), "billing" unordered, and "invoices",
	// unordered, whose filter does not take the events.
	durable := func(stream, name, description, filter string) jetstream.Consumer {
		c, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, Description: description,
			FilterSubjects: []string{filter}, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		require.NoError(t, err)
		return c
	}
	var part jetstream.Consumer
	for q := range partitions {
		f, err := wire.OrderedFilter(wire.DefaultEventsPrefix, q, "events.order.>")
		require.NoError(t, err)
		c := durable(cp.CachedInfo().Config.Name, wire.PartitionDurable("ledger", q), "jsbridge ordered webhook subscription ledger", f)
		if q == p {
			part = c
		}
	}
	durable(wire.DefaultEventsStream, "billing", unordered.Description+"https://billing.example/hook", "events.order.>")
	durable(wire.DefaultEventsStream, "invoices", unordered.Description+"https://invoices.example/hook", "events.invoice.>")

	trace := func(id, stream string) map[string]inspect.Delivery {
		t.Helper()
		tr, err := inspect.TraceEvent(ctx, js, id, inspect.TraceConfig{SourceStream: stream})
		require.NoError(t, err)
		require.NotNil(t, tr.Message)
		out := map[string]inspect.Delivery{}
		for _, d := range tr.Deliveries {
			out[d.Subscription] = d
		}
		require.Len(t, out, len(tr.Deliveries), "one line a subscription")
		return out
	}

	// Nothing delivered yet.
	d := trace("1", "order-1")
	require.Len(t, d, 2, "invoices does not take the event: %v", d)
	require.Equal(t, inspect.DeliveryPending, d["billing"].State, d["billing"].Why)
	require.Equal(t, uint64(1), d["billing"].Sequence)
	require.Equal(t, "billing", d["billing"].Durable)
	require.Equal(t, inspect.DeliveryPending, d["ledger"].State, d["ledger"].Why)
	require.True(t, d["ledger"].Ordered)
	require.Equal(t, p, d["ledger"].Partition)
	require.Equal(t, wire.PartitionDurable("ledger", p), d["ledger"].Durable)
	copySeq1 := d["ledger"].Sequence
	require.Positive(t, copySeq1, "its sequence in the copy")

	// The partition delivers both and acks the second only: nothing
	// settled below the floor, one ack pending.
	batch, err := part.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	require.Len(t, msgs, 2)
	require.NoError(t, msgs[1].DoubleAck(ctx))
	for _, id := range []string{"1", "2"} {
		stream := map[string]string{"1": "order-1", "2": other}[id]
		l := trace(id, stream)["ledger"]
		require.Equal(t, inspect.DeliveryOutstanding, l.State, "event %s: %s", id, l.Why)
		require.Contains(t, l.Why, "1 acks pending")
	}

	// The partition's delivered record covers event 1's stream: settled.
	// A record of another copy (deleted and made again) is not read.
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	subject1 := wire.OrderedPrefix(wire.DefaultEventsPrefix) + fmt.Sprintf(".%d.", p) + "order.order-1.OrderPlaced"
	record := func(copyCreated int64) {
		v, err := json.Marshal(wire.DeliveredRecord{Owner: "replica-7", Copy: copyCreated, Streams: map[string]uint64{wire.StreamKey(subject1): copySeq1}})
		require.NoError(t, err)
		_, err = kv.Put(ctx, wire.DeliveredKey("ledger", p), v)
		require.NoError(t, err)
	}
	record(cp.CachedInfo().Created.UnixNano() + 1)
	require.Equal(t, inspect.DeliveryOutstanding, trace("1", "order-1")["ledger"].State, "another copy's record")
	record(cp.CachedInfo().Created.UnixNano())
	l := trace("1", "order-1")["ledger"]
	require.Equal(t, inspect.DeliverySettled, l.State, l.Why)
	require.Equal(t, fmt.Sprintf("in partition %d's delivered record (written by replica-7), above the ack floor (0)", p), l.Why)
	require.Equal(t, inspect.DeliveryOutstanding, trace("2", other)["ledger"].State, "its stream is not in the record")

	// Acked: at or below the ack floor.
	require.NoError(t, msgs[0].DoubleAck(ctx))
	l = trace("2", other)["ledger"]
	require.Equal(t, inspect.DeliverySettled, l.State, l.Why)
	require.Equal(t, "at or below the ack floor (2)", l.Why)
}
