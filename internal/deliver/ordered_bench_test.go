package deliver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/wire"
)

// BenchmarkOrderedDelivery measures an ordered subscription's steady
// throughput on one replica: b.N events over streams streams (version
// after version, as an events table gives them), 16 partitions, a
// receiver answering 200 at once, MaxInFlight 64. It reports events/s
// from the first delivery to the last, so the provisioning and the first
// claims do not count. The ack path (the double ack, or the delivered
// record's write) is on every event's way.
func BenchmarkOrderedDelivery(b *testing.B) {
	for _, streams := range []int{1, 100} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) { benchOrdered(b, streams) })
	}
}

func benchOrdered(b *testing.B, streams int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := jsbridgetest.Connect(b, jsbridgetest.StartJetStream(b, embedded.Config{}))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	var first, last atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		last.Store(now)
		got.Add(1)
	}))
	defer rc.Close()
	n := b.N
	for i := range n {
		e := event.Event{ID: int64(i + 1), Stream: fmt.Sprintf("order-%d", i%streams), Version: int64(i / streams), Name: "OrderNoted", Data: []byte(`{}`), Created: time.Now()}
		if _, err := js.PublishMsgAsync(forward.Message(e, forward.Config{})); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publishing timed out")
	}
	s := orderedSub("bench", rc.URL)
	s.MaxInFlight = 64
	c, err := deliver.New(js, deliver.Config{Partitions: 16, LeaseTTL: 2 * time.Second, ReplicaID: "bench", Logger: slog.New(slog.DiscardHandler)}, s)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	for got.Load() < int64(n) {
		if ctx.Err() != nil {
			b.Fatalf("%d of %d delivered", got.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	stop()
	<-done
	if d := time.Duration(last.Load() - first.Load()); d > 0 && n > 1 {
		b.ReportMetric(float64(n-1)/d.Seconds(), "events/s")
	}
	// Writes to the park bucket (the delivered records' among them) per
	// event delivered.
	if st, err := js.Stream(ctx, "KV_"+wire.DefaultParkBucket); err == nil {
		if info, err := st.Info(ctx); err == nil {
			b.ReportMetric(float64(info.State.LastSeq)/float64(n), "kv-writes/event")
		}
	}
}
