package forward_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/jsbridgetest"
)

// BenchmarkHandleTraced is Handle on 100 streams × 100 events (fast
// batches), tracing off and on: what the publish spans cost a drain cycle.
// The -meta cases give a third of the events a trace context in their
// meta, as the bench's tracing row does.
func BenchmarkHandleTraced(b *testing.B) {
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
		meta bool // a third of the events carry a trace context in their meta
	}{{"off", noop.NewTracerProvider(), false}, {"on", sdk, false}, {"off-meta", noop.NewTracerProvider(), true}, {"on-meta", sdk, true}} {
		b.Run(c.name, func(b *testing.B) {
			srv := jsbridgetest.StartJetStream(b, embedded.Config{})
			_, js := jsbridgetest.Connect(b, srv)
			_, err := forward.Provision(context.Background(), js, forward.StreamConfig{})
			if err != nil {
				b.Fatal(err)
			}
			fwd, err := forward.New(js, forward.Config{TracerProvider: c.tp})
			if err != nil {
				b.Fatal(err)
			}
			id := int64(0)
			round := 0
			b.ResetTimer()
			for b.Loop() {
				batches := make([]drain.Batch, 100)
				for s := range batches {
					evs := make([]event.Event, 100)
					name := fmt.Sprintf("s%d-%d", round, s)
					for v := range evs {
						id++
						evs[v] = event.Event{ID: id, Stream: name, Version: int64(v), Name: "E", Data: []byte(`{"a":1}`)}
						if c.meta && id%3 == 0 {
							evs[v].Meta.TraceParent = fmt.Sprintf("00-%032x-%016x-01", id, id)
						}
					}
					batches[s] = drain.Batch{Stream: name, Events: evs, Watermark: -1}
				}
				round++
				for _, r := range fwd.Handle(context.Background(), batches) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*10000), "µs/event")
		})
	}
}
