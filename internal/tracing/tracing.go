// Package tracing is what forward and deliver share to carry one event's
// trace through JetStream to the webhook: the W3C Trace Context
// propagator, a carrier for nats.Header that keeps the header names as
// wire spells them (lowercase), the tracer's name, and the span attribute
// keys. It depends on the OpenTelemetry API only, never the SDK, so an
// application that embeds the bridge or the consumer pays for no exporter;
// with the API's default (no-op) tracer provider a span costs a few
// allocations and nothing is recorded.
package tracing

import (
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every jsbridge span.
const ScopeName = "github.com/jsbridge/jsbridge"

// Propagator is the W3C Trace Context propagator. jsbridge always uses it,
// not otel.GetTextMapPropagator (whose default propagates nothing): the
// trace headers are part of the bus and webhook contract (wire), so a
// trace context an event carries travels even when this process exports
// no spans.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns the jsbridge tracer of tp, or of otel's global tracer
// provider when tp is nil (a no-op until the application installs an SDK).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// HeaderCarrier adapts a nats.Header to propagation.TextMapCarrier. Unlike
// propagation.HeaderCarrier it does not canonicalise names: NATS matches
// header names exactly, so "traceparent" stays "traceparent" (the names in
// wire). Get falls back to a case-insensitive match for messages whose
// publisher wrote "Traceparent".
type HeaderCarrier nats.Header

// Get returns the first value of key, or "".
func (c HeaderCarrier) Get(key string) string {
	if vs := c[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range c {
		if len(vs) > 0 && equalFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// Set replaces the values of key with value.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys returns the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// equalFold is ASCII case-insensitive equality (header names are ASCII).
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Span attribute keys jsbridge sets besides the OpenTelemetry messaging and
// HTTP semantic conventions (messaging.system, messaging.destination.name,
// messaging.message.id, http.response.status_code, url.full).
const (
	// AttrStream is the source stream of the event, e.g. "order-42".
	AttrStream = attribute.Key("jsbridge.stream")
	// AttrStreamVersion is the event's 0-based version in its stream.
	AttrStreamVersion = attribute.Key("jsbridge.stream_version")
	// AttrEventName is the event name (type), e.g. "OrderPlaced".
	AttrEventName = attribute.Key("jsbridge.event_name")
	// AttrPublishStatus is how the publish ended: stored, duplicate, failed.
	AttrPublishStatus = attribute.Key("jsbridge.publish.status")
	// AttrPublishStored is how many events of a fast batch JetStream
	// stored (or found duplicate), on the batch's publish span.
	AttrPublishStored = attribute.Key("jsbridge.publish.stored")
	// AttrFirstEventID and AttrLastEventID are the ids of the first and
	// last event of a fast batch, on the batch's publish span.
	AttrFirstEventID = attribute.Key("jsbridge.event_id.first")
	AttrLastEventID  = attribute.Key("jsbridge.event_id.last")
	// AttrSubscription is the subscription of a delivery attempt.
	AttrSubscription = attribute.Key("jsbridge.subscription")
	// AttrAttempt is the attempt number (1-based, JetStream NumDelivered).
	AttrAttempt = attribute.Key("jsbridge.attempt")
	// AttrOutcome is the attempt's outcome (deliver's Outcome* values:
	// ack, retry, term, exhausted, breaker_open, stale_epoch).
	AttrOutcome = attribute.Key("jsbridge.outcome")
	// AttrStatusClass is the attempt's status class (2xx..5xx, timeout,
	// network, tls, forbidden, none).
	AttrStatusClass = attribute.Key("jsbridge.status_class")
	// AttrBreakerState is the endpoint's circuit breaker state when the
	// attempt ended: closed, open or half-open.
	AttrBreakerState = attribute.Key("jsbridge.breaker.state")
)
