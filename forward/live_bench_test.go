package forward_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// BenchmarkHandleLive is Handle on a drain cycle as the live path has
// them at 1,000 events/s: a few streams, one event each (two on one
// stream in the "mixed" case), every stream already published by the
// Forwarder (its position known). An op is one cycle; the JetStream
// server runs in the benchmark's process, so its allocations count too.
func BenchmarkHandleLive(b *testing.B) {
	for _, c := range []struct {
		name    string
		streams int
		hot     int // events of the first stream
	}{{"streams=1", 1, 1}, {"streams=8", 8, 1}, {"streams=8-mixed", 8, 2}} {
		b.Run(c.name, func(b *testing.B) {
			srv := jsbridgetest.StartJetStream(b, embedded.Config{})
			_, js := jsbridgetest.Connect(b, srv)
			if _, err := forward.Provision(context.Background(), js, forward.StreamConfig{}); err != nil {
				b.Fatal(err)
			}
			fwd, err := forward.New(js, forward.Config{})
			if err != nil {
				b.Fatal(err)
			}
			data := []byte(`{"pad":"` + strings.Repeat("x", 480) + `"}`)
			id := int64(0)
			next := make([]int64, c.streams) // each stream's next version
			cycle := func() {
				batches := make([]drain.Batch, c.streams)
				for s := range batches {
					n := 1
					if s == 0 {
						n = c.hot
					}
					name := fmt.Sprintf("live-%d", s)
					evs := make([]event.Event, n)
					for k := range evs {
						id++
						evs[k] = event.Event{ID: id, Stream: name, Version: next[s], Name: "E", Data: data, DataJSON: true}
						next[s]++
					}
					batches[s] = drain.Batch{Stream: name, Events: evs, Watermark: evs[0].Version - 1}
				}
				for _, r := range fwd.Handle(context.Background(), batches) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			cycle() // every stream published once: positions known
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				cycle()
			}
			events := c.streams + c.hot - 1
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*events), "µs/event")
		})
	}
}
