package consumer

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/inspect"
)

// TraceConfig says where TraceEvent looks. Zero fields take the defaults
// of the streams they name.
type TraceConfig struct {
	// Stream and Prefix are the events stream and its subject prefix.
	// Defaults "EVENTS", "events".
	Stream, Prefix string
	// DLQStream and DLQPrefix are the dead-letter stream and its prefix.
	// Defaults "DLQ", "dlq".
	DLQStream, DLQPrefix string
	// AttemptsStream and AttemptsPrefix are the attempts stream and its
	// prefix. Defaults "JSBRIDGE_ATTEMPTS", "attempts".
	AttemptsStream, AttemptsPrefix string
	// SourceStream, when set, is the event's source stream (e.g.
	// "order-42"): when no attempt record says where the event is on the
	// events stream, its subjects are scanned for the event's Nats-Msg-Id.
	SourceStream string
}

// EventMessage is the event's message on the events stream.
type EventMessage struct {
	// Sequence and Subject locate it; PublishedAt is when JetStream stored it.
	Sequence    uint64    `json:"sequence"`
	Subject     string    `json:"subject"`
	PublishedAt time.Time `json:"published_at"`
	// Name, SourceStream and Version are ce-type, ce-subject and
	// ce-streamversion (decoded).
	Name         string `json:"name"`
	SourceStream string `json:"stream"`
	Version      int64  `json:"version"`
	// TraceParent is the message's traceparent header, "" when none.
	TraceParent string `json:"traceparent,omitempty"`
}

// Attempt is the record of one delivery attempt, as the consumer writes it
// to the attempts stream (JSON, these keys; see AttemptsConfig: by default
// every attempt but a success on the first one) and `consumer trace`
// reads it.
type Attempt struct {
	// Subscription is the subscription's name.
	Subscription string `json:"subscription"`
	// EventID is the event id (Nats-Msg-Id).
	EventID string `json:"event_id"`
	// Attempt is the attempt number, 1-based (JetStream NumDelivered).
	Attempt int `json:"attempt"`
	// At is when the request was sent (when the attempt began if none was).
	At time.Time `json:"at"`
	// Replica names the consumer process that made the attempt
	// (AttemptsConfig.Replica).
	Replica string `json:"replica"`
	// Status is the HTTP status, 0 without a response.
	Status int `json:"status"`
	// StatusClass is 2xx..5xx, timeout, network, tls, forbidden or none.
	StatusClass string `json:"status_class"`
	// Outcome is ack, retry, term, exhausted, breaker_open or stale_epoch (the labels of
	// jsbridge_consumer_deliveries_total).
	Outcome string `json:"outcome"`
	// Latency is the time from handing the request to the circuit breaker
	// to the response or error; 0 when nothing was sent. In JSON,
	// nanoseconds.
	Latency time.Duration `json:"latency_ns"`
	// Error says why the attempt failed ("" when acked), e.g.
	// "HTTP 503 Service Unavailable".
	Error string `json:"error,omitempty"`
	// Breaker is the endpoint's circuit breaker state after the attempt.
	Breaker string `json:"breaker"`
	// Subject and StreamSeq locate the message on the events stream.
	Subject   string `json:"subject"`
	StreamSeq uint64 `json:"stream_seq"`
	// TraceID is the OpenTelemetry trace id of the attempt's span, "" when
	// the message carried no trace context and tracing is off.
	TraceID string `json:"trace_id,omitempty"`
}

// EventTrace is everything JetStream holds about one event's deliveries.
type EventTrace struct {
	EventID string `json:"event_id"`
	// Message is the event on the events stream; nil when it was not found
	// (no attempt names it and no SourceStream was given, or it is gone:
	// the events stream's limits, a purge).
	Message *EventMessage `json:"message,omitempty"`
	// Attempts are the attempt records, by subscription, then attempt
	// number, then time. Records older than the attempts stream's max age
	// are gone; a success on the first attempt has none under
	// AttemptsRecordFailures (Deliveries says it was settled).
	Attempts []Attempt `json:"attempts"`
	// DeadLetters are the event's dead letters (of any subscription).
	DeadLetters []DeadLetter `json:"dead_letters"`
	// Deliveries say where the event stands for each subscription the
	// positions bucket names on the event's partition, by subscription:
	// what tells an event delivered by a 2xx on its first attempt (no
	// attempt record under AttemptsRecordFailures) from one never
	// delivered. Empty when Message is nil (the event was not found:
	// give TraceConfig.SourceStream).
	Deliveries []Delivery `json:"deliveries"`
}

// Where an event stands for one subscription (Delivery.State).
const (
	// DeliverySettled: answered 2xx or dead-lettered
	// (EventTrace.DeadLetters tells which), or covered by the
	// partition's floor or the subscription's cursor without being for
	// it (the positions bucket holds no filters), or before the
	// subscription's start.
	DeliverySettled = inspect.DeliverySettled
	// DeliveryOutstanding: read and not settled: in flight, waiting for
	// a retry, or the head of a stream set aside and retried in place.
	DeliveryOutstanding = inspect.DeliveryOutstanding
	// DeliveryPending: not settled and not known to be in hand: above
	// the partition's floor, behind the subscription's cursor, or held
	// behind a stream set aside.
	DeliveryPending = inspect.DeliveryPending
)

// Delivery is where an event stands for one subscription its
// partition's record or cursor keys in the positions bucket name: its
// Subscription, Partition, Sequence (on the events stream), the Key it
// was read from (the record pos.p<N>, or the cursor
// cur.<subscription>.p<N> while the subscription is not live), its
// State (DeliverySettled, DeliveryOutstanding or DeliveryPending) and
// Why, what State was read from.
type Delivery = inspect.Delivery

// TraceEvent collects what JetStream holds about event eventID: its
// attempt records, its message on the events stream (by the sequence an
// attempt record names, else by scanning cfg.SourceStream's subjects), its
// dead letters, and, once the message is found, where it stands for each
// subscription (EventTrace.Deliveries). A stream that does not exist
// contributes nothing; other errors are returned, wrapped.
func TraceEvent(ctx context.Context, js jetstream.JetStream, eventID string, cfg TraceConfig) (EventTrace, error) {
	tr, err := inspect.TraceEvent(ctx, js, eventID, inspect.TraceConfig(cfg))
	out := EventTrace{EventID: tr.EventID, Attempts: make([]Attempt, len(tr.Attempts)), DeadLetters: fromStored(tr.DeadLetters),
		Deliveries: tr.Deliveries}
	if out.Deliveries == nil {
		out.Deliveries = []Delivery{}
	}
	if out.DeadLetters == nil {
		out.DeadLetters = []DeadLetter{}
	}
	if tr.Message != nil {
		m := EventMessage(*tr.Message)
		out.Message = &m
	}
	for i, a := range tr.Attempts {
		out.Attempts[i] = Attempt(a)
	}
	return out, err
}
