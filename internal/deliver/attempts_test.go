package deliver_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
	"github.com/jsbridge/jsbridge/wire"
)

const bridgeTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// attemptLog provisions and runs an AttemptLog until the test ends.
func attemptLog(t *testing.T, b bundle, reg prometheus.Registerer) *attemptlog.Log {
	t.Helper()
	l, err := attemptlog.New(b.js, attemptlog.Config{Replica: "replica-a", Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, l.Provision(b.ctx))
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// An event that failed twice and then succeeded has three attempt records,
// in order, with status, outcome, replica and latency, and its message on
// the events stream; each attempt is a span under the bridge's publish
// span, whose context the POST carries on in traceparent.
func TestAttemptsRecordedAndTraced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n < 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	log := attemptLog(t, b, nil)
	b.run(t, deliver.Config{Attempts: log, TracerProvider: tp}, sub("orders", rc.URL))

	b.publishWith(t, 42, "order-7", "OrderPlaced", `{}`, nats.Header{wire.HeaderTraceParent: []string{bridgeTraceParent}})
	reqs := rc.waitFor(t, 3)
	requireSettled(t, b, "orders", 1)

	var tr inspect.EventTrace
	require.Eventually(t, func() bool {
		var err error
		tr, err = inspect.TraceEvent(b.ctx, b.js, "42", inspect.TraceConfig{})
		return err == nil && len(tr.Attempts) == 3
	}, 10*time.Second, 20*time.Millisecond, "three attempt records")
	for i, a := range tr.Attempts {
		require.Equal(t, "orders", a.Subscription)
		require.Equal(t, "42", a.EventID)
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, "replica-a", a.Replica)
		require.Equal(t, "closed", a.Breaker)
		require.Positive(t, a.Latency)
		require.False(t, a.At.IsZero())
		require.Equal(t, uint64(1), a.StreamSeq)
		require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", a.TraceID)
	}
	require.Equal(t, []int{503, 503, 204}, []int{tr.Attempts[0].Status, tr.Attempts[1].Status, tr.Attempts[2].Status})
	require.Equal(t, []string{attempt.OutcomeRetry, attempt.OutcomeRetry, attempt.OutcomeAck}, []string{tr.Attempts[0].Outcome, tr.Attempts[1].Outcome, tr.Attempts[2].Outcome})
	require.Equal(t, "HTTP 503 Service Unavailable", tr.Attempts[0].Error)
	require.Empty(t, tr.Attempts[2].Error)
	require.NotNil(t, tr.Message)
	require.Equal(t, uint64(1), tr.Message.Sequence)
	require.Equal(t, "order-7", tr.Message.SourceStream)
	require.Equal(t, "OrderPlaced", tr.Message.Name)
	require.Equal(t, bridgeTraceParent, tr.Message.TraceParent)
	require.Empty(t, tr.DeadLetters)

	// Spans: one per attempt, children of the publish span in traceparent.
	wantTrace, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	wantParent, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 3)
	bySpanID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for i, s := range spans {
		require.Equal(t, "deliver orders", s.Name())
		require.Equal(t, trace.SpanKindClient, s.SpanKind())
		require.Equal(t, wantTrace, s.SpanContext().TraceID())
		require.Equal(t, wantParent, s.Parent().SpanID())
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		require.Equal(t, int64(i+1), attrs["jsbridge.attempt"].AsInt64())
		require.Equal(t, tr.Attempts[i].Outcome, attrs["jsbridge.outcome"].AsString())
		require.Equal(t, int64(tr.Attempts[i].Status), attrs["http.response.status_code"].AsInt64())
		require.Equal(t, "closed", attrs["jsbridge.breaker.state"].AsString())
		require.Equal(t, "orders", attrs["jsbridge.subscription"].AsString())
		bySpanID[s.SpanContext().SpanID()] = s
	}
	// Each POST's traceparent names its own attempt span.
	for i, r := range reqs[:3] {
		tp := r.header.Get(wire.HeaderTraceParent)
		require.Len(t, tp, 55, "request %d traceparent %q", i, tp)
		require.Equal(t, wantTrace.String(), tp[3:35])
		sid, err := trace.SpanIDFromHex(tp[36:52])
		require.NoError(t, err)
		s, ok := bySpanID[sid]
		require.True(t, ok, "request %d: traceparent %s names no attempt span", i, tp)
		require.Equal(t, int64(i+1), attemptAttr(s))
	}
}

func attemptAttr(s sdktrace.ReadOnlySpan) int64 {
	for _, kv := range s.Attributes() {
		if kv.Key == "jsbridge.attempt" {
			return kv.Value.AsInt64()
		}
	}
	return 0
}

// A permanent failure shows as a term attempt and a dead letter.
func TestTraceShowsDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, status(http.StatusUnprocessableEntity))
	dlq := deadletter.New(b.js, deadletter.Config{})
	require.NoError(t, dlq.Provision(b.ctx))
	log := attemptLog(t, b, nil)
	b.run(t, deliver.Config{Attempts: log, DeadLetters: dlq}, sub("orders", rc.URL))
	b.publish(t, 7, "order-1", "OrderPlaced", `{}`)
	rc.waitFor(t, 1)

	var tr inspect.EventTrace
	require.Eventually(t, func() bool {
		var err error
		tr, err = inspect.TraceEvent(b.ctx, b.js, "7", inspect.TraceConfig{})
		return err == nil && len(tr.Attempts) == 1 && len(tr.DeadLetters) == 1
	}, 10*time.Second, 20*time.Millisecond, "one attempt and one dead letter")
	require.Equal(t, attempt.OutcomeTerm, tr.Attempts[0].Outcome)
	require.Equal(t, 422, tr.Attempts[0].Status)
	require.Equal(t, "orders", tr.DeadLetters[0].Subscription)
	require.Empty(t, tr.Attempts[0].TraceID, "no trace context, tracing off: no trace id")
}

// Without attempt records, --stream finds the event by scanning its
// stream's subjects; an unknown event has nothing.
func TestTraceFindsEventBySourceStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publish(t, 1, "order-1", "A", `{}`)
	b.publish(t, 2, "order-1", "B", `{}`)
	b.publish(t, 3, "order-2", "A", `{}`)
	tr, err := inspect.TraceEvent(b.ctx, b.js, "2", inspect.TraceConfig{SourceStream: "order-1"})
	require.NoError(t, err)
	require.NotNil(t, tr.Message)
	require.Equal(t, uint64(2), tr.Message.Sequence)
	require.Equal(t, "B", tr.Message.Name)
	require.Empty(t, tr.Attempts)

	tr, err = inspect.TraceEvent(b.ctx, b.js, "99", inspect.TraceConfig{SourceStream: "order-1"})
	require.NoError(t, err)
	require.Nil(t, tr.Message)
}

// A full queue drops records instead of blocking the delivery, and counts
// them.
func TestAttemptLogDropsWhenFull(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	l, err := attemptlog.New(b.js, attemptlog.Config{Buffer: 1, Registerer: reg})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		for range 3 {
			l.RecordAttempt(attemptlog.Attempt{Subscription: "s", EventID: "1"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RecordAttempt blocked on a full queue")
	}
	n, err := testutil.GatherAndCount(reg, "jsbridge_consumer_attempt_records_dropped_total")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Equal(t, 2.0, mfs[0].GetMetric()[0].GetCounter().GetValue())
}

// Records queued when the log is stopped (the deliveries that finished
// during shutdown) are still written before Run returns.
func TestAttemptLogWritesQueuedRecordsAtStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, err := attemptlog.New(b.js, attemptlog.Config{})
	require.NoError(t, err)
	require.NoError(t, l.Provision(b.ctx))
	for i := range 3 {
		l.RecordAttempt(attemptlog.Attempt{Subscription: "orders", EventID: "5", Attempt: i + 1, Outcome: attempt.OutcomeRetry})
	}
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	l.Run(ctx)
	tr, err := inspect.TraceEvent(b.ctx, b.js, "5", inspect.TraceConfig{})
	require.NoError(t, err)
	require.Len(t, tr.Attempts, 3)
	require.Equal(t, 3, tr.Attempts[2].Attempt)
}
