package deliver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// recordedPartition is a fencedPartition whose acks go behind a delivered
// record claimed in a real park bucket, written by its flusher until
// cleanup.
func recordedPartition(t *testing.T, kv jetstream.KeyValue, owner string) *partition {
	t.Helper()
	pt, _, _ := fencedPartition(t)
	rec := newDeliveredRecord(kv, wire.DeliveredKey("orders", 0), owner, time.Unix(0, 1), pt.clock, pt.log)
	require.NoError(t, rec.claim(context.Background()))
	rec.lost = func() { pt.lease.Lose(); pt.release() }
	pt.record, pt.hol.record = rec, rec
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); rec.run(pt.lease, stop) }()
	t.Cleanup(func() { close(stop); <-done })
	return pt
}

// readRecord returns the delivered record stored under key.
func readRecord(t *testing.T, kv jetstream.KeyValue, key string) deliveredDoc {
	t.Helper()
	e, err := kv.Get(context.Background(), key)
	require.NoError(t, err)
	var doc deliveredDoc
	require.NoError(t, json.Unmarshal(e.Value(), &doc))
	return doc
}

// checkedAckMsg is an ackMsg whose Ack first runs check.
type checkedAckMsg struct {
	*ackMsg
	check func()
}

func (m *checkedAckMsg) Ack() error { m.check(); return m.ackMsg.Ack() }

// An event answered 2xx is acked only after a write of the partition's
// delivered record holds it.
func TestAnAckGoesOutOnlyOnceTheDeliveredRecordHoldsIt(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	pt := recordedPartition(t, kv, "first")
	key := wire.StreamKey(newFakeMsg("order-1", 0, 0).Subject())
	var recorded atomic.Uint64
	m := &checkedAckMsg{ackMsg: newAckMsg(10), check: func() {
		recorded.Store(readRecord(t, kv, wire.DeliveredKey("orders", 0)).Streams[key])
	}}
	pt.hol.ack(m, func() *slog.Logger { return pt.log })
	require.Equal(t, int32(1), m.acks.Load())
	require.Equal(t, uint64(10), recorded.Load(), "the record held the event when its ack went out")
	doc := readRecord(t, kv, wire.DeliveredKey("orders", 0))
	require.Equal(t, "first", doc.Owner)
}

// A former owner whose record write finds the record claimed by a new
// owner (its lease lost while it was frozen, say) acks nothing more and
// stops its partition at once; the new owner read what it wrote before.
func TestAFormerOwnerWhoseRecordWasTakenAcksNothingMoreAndStops(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	first := recordedPartition(t, kv, "first")
	key := wire.StreamKey(newFakeMsg("order-1", 0, 0).Subject())
	m := newAckMsg(10)
	first.hol.ack(m, func() *slog.Logger { return first.log })
	require.Equal(t, int32(1), m.acks.Load())

	second := newDeliveredRecord(kv, wire.DeliveredKey("orders", 0), "second", time.Unix(0, 1), first.clock, first.log)
	require.NoError(t, second.claim(ctx))
	require.Equal(t, uint64(10), second.inheritedSeq(key), "the new owner read what the former one wrote")

	later := newAckMsg(11)
	first.hol.ack(later, func() *slog.Logger { return first.log })
	require.Zero(t, later.acks.Load(), "no ack once the record is someone else's")
	require.True(t, first.record.lostLease())
	require.False(t, first.lease.MayStart(), "the partition starts nothing more")
	require.ErrorIs(t, first.lease.mayAck(), errLeasePassed)
	require.Error(t, first.ctx.Err(), "the partition was released")
	require.Equal(t, "second", readRecord(t, kv, wire.DeliveredKey("orders", 0)).Owner)
}

// A former owner answered an event 2xx, wrote it in the delivered record
// and froze before its ack went out (here: the ack is dropped, then the
// replica stops). The event is redelivered to the new owner, which acks it
// without a POST, as delivered: the receiver sees it once, and the
// stream's later events follow.
func TestANewOwnerDoesNotSendAgainWhatTheRecordSaysWasDelivered(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for an AckWait's redelivery (about 5 s)")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := startJetStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string // event ids in arrival order
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(wire.HeaderIdempotencyKey))
		mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	publish := func(from, to int64) {
		for v := from; v < to; v++ {
			e := event.Event{ID: v + 1, Stream: "order-1", Version: v, Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
			_, err := js.PublishMsg(ctx, forward.Message(e, forward.Config{}))
			require.NoError(t, err)
		}
	}
	s := subscription.Subscription{
		Name: "frozen", FilterSubjects: []string{"events.order.>"}, URL: rc.URL, AllowPrivate: true,
		Secrets:  []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("deliver-test-secret-0123456789"))},
		Ordering: subscription.OrderingStream, Start: subscription.Start{Policy: subscription.StartAll}, AckWait: 3 * time.Second, Timeout: 1400 * time.Millisecond,
	}
	run := func(cfg Config) (stop func()) {
		cfg.Partitions, cfg.LeaseTTL, cfg.Logger = 1, time.Second, slog.New(slog.DiscardHandler)
		c, err := New(js, cfg, s)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return func() {
			cancel()
			require.NoError(t, <-done)
		}
	}

	// The first owner drops the ack of version 3 (event id 4).
	var dropped atomic.Bool
	stopFirst := run(Config{ReplicaID: "first", sendAck: func(m jetstream.Msg) error {
		if attempt.EventID(m) == event.FormatID(4) {
			dropped.Store(true)
			return nil
		}
		return m.Ack()
	}})
	publish(0, 4)
	require.Eventually(t, func() bool { return dropped.Load() && len(received()) == 4 }, 20*time.Second, 10*time.Millisecond)
	stopFirst()

	stopSecond := run(Config{ReplicaID: "second"})
	defer stopSecond()
	publish(4, 6)
	require.Eventually(t, func() bool { return len(received()) >= 6 }, 30*time.Second, 10*time.Millisecond)
	var want []string
	for id := int64(1); id <= 6; id++ {
		want = append(want, event.FormatID(id))
	}
	require.Equal(t, want, received(), "version 3 arrived once; 4 and 5 after it")
	require.Never(t, func() bool { return len(received()) > 6 }, time.Second, 50*time.Millisecond,
		"version 3 came back to the new owner after AckWait and was acked without a POST")
}

// newTestRunner is a runner of sub whose sender POSTs with client through
// br, on clock, with tracer's spans; no health, throttle or JetStream.
func newTestRunner(tb testing.TB, sub subscription.Subscription, client *http.Client, br *breaker.Breaker, clock clockwork.Clock, tracer trace.Tracer) *runner {
	tb.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := webhook.NewSigner(webhook.SchemeStandard, "whsec_"+strings.Repeat("MDEyMzQ1Njc4OWFiY2RlZg==", 1))
	if err != nil {
		tb.Fatal(err)
	}
	snd, err := attempt.New(attempt.Config{Subscription: sub, Signer: signer, Client: client, UserAgent: "jsbridge-test"}, attempt.Deps{
		Breaker: br, Clock: clock, Tracer: tracer,
		Metrics: attempt.Metrics{Deliveries: m.deliveries, Duration: m.duration.WithLabelValues(sub.Name)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &runner{snd: snd, sub: sub, log: snd.Logger(), br: br, endpoint: snd.Endpoint(), metrics: m, clock: clock, inFlight: m.inFlight.WithLabelValues(sub.Name)}
}

// answerLostKV is a park bucket whose next Update writes and then loses
// its answer (a KV stream leader killed or starved between the two), as
// "nats: no response from stream" did in a soak run.
type answerLostKV struct {
	jetstream.KeyValue
	lose atomic.Bool
}

func (kv *answerLostKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	if err == nil && kv.lose.CompareAndSwap(true, false) {
		return 0, nats.ErrNoResponders
	}
	return rev, err
}

// A write of the delivered record that landed although its answer was
// lost is the owner's own: the next write goes on from its revision, the
// partition keeps its lease and acks. Before the claim token, the next
// write found the revision moved, took it for a new owner's claim and
// stopped the partition, with nobody owning it until its lease expired
// (nine partitions in 30 s of a soak run, each re-claimed and reset).
// A real claim by another replica still stops it.
func TestARecordWriteWhoseAnswerWasLostIsNotTakenForANewOwners(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	ctx := context.Background()
	bucket, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.DefaultParkBucket})
	require.NoError(t, err)
	kv := &answerLostKV{KeyValue: bucket}
	pt := recordedPartition(t, kv, "first")
	key := wire.StreamKey(newFakeMsg("order-1", 0, 0).Subject())

	kv.lose.Store(true)
	w := pt.record.settle(key, 10)
	<-w.done
	require.ErrorIs(t, w.err, nats.ErrNoResponders, "the write landed, its answer did not")
	require.Equal(t, uint64(10), readRecord(t, bucket, wire.DeliveredKey("orders", 0)).Streams[key])

	m := newAckMsg(11)
	pt.hol.ack(m, func() *slog.Logger { return pt.log })
	require.Equal(t, int32(1), m.acks.Load(), "acked: the record holds it")
	require.False(t, pt.record.lostLease(), "its own write is no new owner's")
	require.NoError(t, pt.lease.mayAck())
	require.NoError(t, pt.ctx.Err(), "the partition goes on")
	doc := readRecord(t, bucket, wire.DeliveredKey("orders", 0))
	require.Equal(t, uint64(11), doc.Streams[key])
	require.Equal(t, "first", doc.Owner)

	// The same replica claiming the partition anew is another claim.
	again := newDeliveredRecord(bucket, wire.DeliveredKey("orders", 0), "first", time.Unix(0, 1), pt.clock, pt.log)
	require.NoError(t, again.claim(ctx))
	later := newAckMsg(12)
	pt.hol.ack(later, func() *slog.Logger { return pt.log })
	require.Zero(t, later.acks.Load(), "no ack once another claim wrote the record")
	require.True(t, pt.record.lostLease())
	require.Error(t, pt.ctx.Err(), "the partition was released")
}

// headerMsg is a jetstream.Msg with headers and a subject only.
type headerMsg struct {
	jetstream.Msg
	h nats.Header
}

func (m headerMsg) Headers() nats.Header { return m.h }
func (m headerMsg) Subject() string      { return "events.order.order-1.Placed" }

// dataMsg is a headerMsg with a body.
type dataMsg struct {
	headerMsg
	data []byte
}

func (m dataMsg) Data() []byte { return m.data }
