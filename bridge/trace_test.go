package bridge_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/bridge"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
	"github.com/jsbridge/jsbridge/wire"
)

// tracedProvider records spans into an in-memory exporter, as one process's
// SDK would export them.
func tracedProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// The trace context an app stores in an event's meta comes out at the
// receiver: same trace id in traceparent, with the bridge's publish span and
// the consumer's attempt spans (one per attempt) in between, each the
// parent of the next.
func TestTraceContextFromMetaReachesTheReceiver(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)

	bridgeTP, bridgeSpans := tracedProvider(t)
	b, err := bridge.New(bb.pool, bb.js, bridge.Config{Schema: bb.schema, PollInterval: 20 * time.Millisecond, Logger: quiet(), TracerProvider: bridgeTP})
	require.NoError(t, err)
	require.NoError(t, b.Start(ctx))
	t.Cleanup(func() { _ = b.Stop(context.Background()) })

	var mu sync.Mutex
	var got []string // traceparent of each request
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(wire.HeaderTraceParent))
		n := len(got)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // one retry: two attempt spans
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	consumerTP, consumerSpans := tracedProvider(t)
	c, err := consumer.New(bb.js, consumer.Config{TracerProvider: consumerTP, Subscriptions: []consumer.Subscription{{
		Name: "orders", FilterSubjects: []string{wire.CategoryFilter(wire.DefaultEventsPrefix, "order")}, URL: rc.URL,
		Secrets:      []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("bridge-trace-test-secret-0123"))},
		BackOff:      []time.Duration{20 * time.Millisecond},
		AllowPrivate: true,
		Start:        consumer.Start{Policy: consumer.StartAll},
	}}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	const appTrace, appSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	_, err = bb.store.Append(ctx, "order-1", store.NoStream, store.NewEvent{Name: "OrderPlaced", Data: []byte(`{}`),
		Meta: event.Meta{Correlation: "c-1", TraceParent: "00-" + appTrace + "-" + appSpan + "-01"}})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2 && len(consumerSpans.GetSpans()) >= 2
	}, 30*time.Second, 10*time.Millisecond, "two attempts delivered and their spans ended")

	// Bridge: one publish span, child of the app's span.
	pubs := bridgeSpans.GetSpans().Snapshots()
	require.Len(t, pubs, 1)
	pub := pubs[0]
	require.Equal(t, appTrace, pub.SpanContext().TraceID().String())
	require.Equal(t, appSpan, pub.Parent().SpanID().String())
	require.Equal(t, trace.SpanKindProducer, pub.SpanKind())

	// Consumer: one span per attempt, children of the publish span.
	attempts := consumerSpans.GetSpans().Snapshots()
	require.Len(t, attempts, 2)
	ids := map[string]bool{}
	for _, s := range attempts {
		require.Equal(t, appTrace, s.SpanContext().TraceID().String())
		require.Equal(t, pub.SpanContext().SpanID(), s.Parent().SpanID(), "attempt span %q is a child of the publish span", s.Name())
		ids[s.SpanContext().SpanID().String()] = true
	}

	// Receiver: the same trace id, the parent being an attempt span.
	mu.Lock()
	defer mu.Unlock()
	for i, tp := range got[:2] {
		require.Len(t, tp, 55, "request %d: traceparent %q", i, tp)
		require.Equal(t, appTrace, tp[3:35], "request %d continues the app's trace", i)
		require.True(t, ids[tp[36:52]], "request %d: parent %s is an attempt span", i, tp[36:52])
	}
	require.NotEqual(t, got[0], got[1], "each attempt sends its own span")
}
