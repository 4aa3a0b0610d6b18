package attempt

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/wire"
)

// BenchmarkAttempt is one unordered attempt's own work, as the consumer
// row makes it at full speed: the span, the CloudEvents body, signing,
// the POST to a loopback receiver (which answers 204, as the bench's
// does) through the endpoint's breaker. The receiver runs in the same
// process, so ns/op and allocs/op count it too; it is the same before and
// after a change.
func BenchmarkAttempt(b *testing.B) {
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(rc.Close)
	set, err := breaker.NewSet(breaker.Settings{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	sub := subscription.Subscription{Name: "orders", URL: rc.URL + "/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"}, AllowPrivate: true}.WithDefaults()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	r := newTestSender(b, sub, client, Deps{Breaker: set.Breaker(sub.URL), Tracer: tracing.Tracer(noop.NewTracerProvider())})
	msg := benchMessage()
	ctx := context.Background()
	// unordered: no ordering fields; ordered: the version chain and the
	// order signature of a partition's owner.
	for _, chain := range []*Chain{nil, {Previous: 2, Partition: 1, Epoch: 7}} {
		name := "unordered"
		if chain != nil {
			name = "ordered"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s := r.Attempt(ctx, msg, 1, Call{Chain: chain})
				if s.Act != ActAck || s.Response.Status != http.StatusNoContent {
					b.Fatalf("act %d, status %d, err %v", s.Act, s.Response.Status, s.Response.Err)
				}
				r.Count(OutcomeAck, s.Class, s.Response.Status)
				r.End(s.Trace)
			}
		})
	}
}

// BenchmarkRequest is the part of an attempt that builds the webhook
// before its POST: the request's headers (requestHeader) and the
// CloudEvents body, for an event's first structured-mode webhook (it
// builds the envelope and checks the data) and for the others (another
// subscription, a retry: the envelope built already).
func BenchmarkRequest(b *testing.B) {
	sub := subscription.Subscription{Name: "orders", URL: "http://127.0.0.1:1/hook", FilterSubjects: []string{"events.>"}, Secrets: []string{"x"}, AllowPrivate: true}.WithDefaults()
	set, err := breaker.NewSet(breaker.Settings{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := newTestSender(b, sub, http.DefaultClient, Deps{Breaker: set.Breaker(sub.URL)})
	msg := benchMessage()
	b.Run("first-webhook", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			msg.Envelope = new(reader.Envelope)
			if _, _, err := r.request(msg, "1042", "replica-1", false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("envelope-built", func(b *testing.B) {
		msg.Envelope = new(reader.Envelope)
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := r.request(msg, "1042", "replica-1", false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchMessage is the benchmarks' event: the bridge's headers and 230 B of
// JSON data (the consumer row's message).
func benchMessage() reader.Event {
	data := []byte(`{"order":"order-42","lines":[{"sku":"A-1","qty":2,"price":"12.50"},{"sku":"B-7","qty":1,"price":"99.00"}],"customer":{"id":"c-9","tier":"gold"},"note":"` + strings.Repeat("x", 96) + `"}`)
	return reader.Event{Subject: "events.order.order-42.OrderPlaced", Header: nats.Header{
		wire.HeaderMsgID: {"1042"}, wire.HeaderID: {"1042"}, wire.HeaderType: {"OrderPlaced"}, wire.HeaderSubject: {"order-42"},
		wire.HeaderSource: {"jsbridge"}, wire.HeaderSpecVersion: {"1.0"}, wire.HeaderContentType: {"application/json"},
		wire.HeaderTime: {"2026-11-26T07:00:00.123456Z"}, wire.HeaderStreamVersion: {"3"},
		wire.HeaderCorrelationID: {"c-1"}, wire.HeaderCausationID: {"c-0"},
	}, Data: data}
}
