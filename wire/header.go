package wire

import "strings"

// CloudEvents attribute headers, as the CloudEvents NATS and HTTP bindings
// (binary content mode) name them: "ce-" plus the attribute name. Forward
// sets them on every JetStream message, values encoded with
// EncodeHeaderValue; deliver copies them onto binary-mode webhooks. Source:
// CloudEvents spec v1.0, nats-protocol-binding.md and
// http-protocol-binding.md.
const (
	// HeaderPrefixCE is the prefix of every CloudEvents attribute header.
	HeaderPrefixCE    = "ce-"
	HeaderSpecVersion = "ce-specversion"
	HeaderID          = "ce-id"
	HeaderType        = "ce-type"
	HeaderSource      = "ce-source"
	HeaderSubject     = "ce-subject"
	HeaderTime        = "ce-time"
	// HeaderStreamVersion carries our extension attribute streamversion: the
	// event's 0-based version in its stream.
	HeaderStreamVersion = "ce-streamversion"
	// HeaderCorrelationID carries the extension attribute correlationid.
	HeaderCorrelationID = "ce-correlationid"
	// HeaderCausationID carries the extension attribute causationid.
	HeaderCausationID = "ce-causationid"
	// HeaderContentType is the content type of the data (binary mode) or of
	// the body.
	HeaderContentType = "Content-Type"
)

// IsCEHeader reports whether name is a CloudEvents attribute header
// ("ce-" prefix, any case, as HTTP and NATS headers are matched).
func IsCEHeader(name string) bool {
	return len(name) > len(HeaderPrefixCE) && strings.EqualFold(name[:len(HeaderPrefixCE)], HeaderPrefixCE)
}

// NATS JetStream headers jsbridge sets. They are the same strings as
// nats.go's jetstream.MsgIDHeader, ExpectedStreamHeader,
// ExpectedLastSubjSeqHeader and ExpectedLastSubjSeqSubjHeader (a test
// checks it); code that already imports jetstream may use either, and
// everything else uses these. Source: NATS JetStream headers reference.
const (
	// HeaderMsgID is the message id JetStream deduplicates by within the
	// stream's duplicate window. jsbridge sets it to the event id (see
	// IdempotencyKey); a dead letter's is "<subscription>:<event id>".
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderExpectedStream makes a publish fail unless this stream stores it.
	HeaderExpectedStream = "Nats-Expected-Stream"
	// HeaderExpectedLastSubjectSequence makes a publish fail unless the last
	// message on the subjects of HeaderExpectedLastSubjectSequenceSubject
	// (or on its own subject) has this stream sequence: the bridge's fence.
	HeaderExpectedLastSubjectSequence = "Nats-Expected-Last-Subject-Sequence"
	// HeaderExpectedLastSubjectSequenceSubject is the filter (a StreamFilter)
	// HeaderExpectedLastSubjectSequence applies to.
	HeaderExpectedLastSubjectSequenceSubject = "Nats-Expected-Last-Subject-Sequence-Subject"
	// HeaderPrefixNATS is the prefix of every header JetStream reads as an
	// instruction; a dead letter never copies one from the original.
	HeaderPrefixNATS = "Nats-"
	// HeaderNumPending is what a batched direct get adds to each message
	// it returns: how many matching messages follow (not stored; the
	// bench's storage row leaves it out of a message's size).
	HeaderNumPending = "Nats-Num-Pending"
)

// HeaderIdempotencyKey carries the event id on every webhook delivery
// attempt, replays of dead letters included; receivers deduplicate by it.
// Its value is IdempotencyKey(event id), the same string as ce-id and
// Nats-Msg-Id. Source: IETF draft-ietf-httpapi-idempotency-key-header.
const HeaderIdempotencyKey = "Idempotency-Key"

// IdempotencyKey returns the Idempotency-Key value for an event id as it
// travels in Nats-Msg-Id and ce-id (base-10 digits): the id itself. It
// exists so the rule has a name: one event, one key, on every attempt.
func IdempotencyKey(eventID string) string { return eventID }

// Headers a dead letter carries besides the original message's ce-* and
// Content-Type headers. Its Nats-Msg-Id is "<subscription>:<event id>".
const (
	HeaderDLQSubscription  = "Jsbridge-Dlq-Subscription"    // subscription name
	HeaderDLQEndpoint      = "Jsbridge-Dlq-Endpoint"        // endpoint, as breaker.Endpoint renders it
	HeaderDLQEventID       = "Jsbridge-Dlq-Event-Id"        // event id: the Idempotency-Key of a replay
	HeaderDLQSubject       = "Jsbridge-Dlq-Subject"         // original subject on the events stream
	HeaderDLQStreamSeq     = "Jsbridge-Dlq-Stream-Seq"      // original sequence on the events stream
	HeaderDLQStatus        = "Jsbridge-Dlq-Status"          // last HTTP status, 0 without a response
	HeaderDLQReason        = "Jsbridge-Dlq-Reason"          // last error, e.g. "HTTP 422 Unprocessable Entity"
	HeaderDLQAttempts      = "Jsbridge-Dlq-Attempts"        // deliveries of the message (JetStream NumDelivered)
	HeaderDLQPublishedAt   = "Jsbridge-Dlq-Published-At"    // RFC 3339: when the event reached the events stream
	HeaderDLQLastAttemptAt = "Jsbridge-Dlq-Last-Attempt-At" // RFC 3339: when the last attempt was made
)

// DLQMsgID returns the Nats-Msg-Id of a dead letter: "<subscription>:<event
// id>", so a dead letter written twice within the DLQ's duplicate window is
// stored once per subscription.
func DLQMsgID(subscription, eventID string) string { return subscription + ":" + eventID }

// W3C Trace Context headers (https://www.w3.org/TR/trace-context/), the
// names OpenTelemetry's propagation.TraceContext injects and extracts (a
// test checks it). Forward sets them, lowercase as written here, on every
// JetStream message whose publish was traced or whose event carried a
// trace context; deliver continues the trace from them and sends them on
// every webhook attempt (HTTP matches header names in any case). They are
// also the keys at the top level of an event's meta that carry the trace
// context the app appended it in, as the CloudEvents distributed tracing
// extension names its attributes (event.ParseMeta reads them).
const (
	// HeaderTraceParent is "<version>-<trace id>-<parent id>-<flags>",
	// e.g. "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".
	HeaderTraceParent = "traceparent"
	// HeaderTraceState is the vendor-specific list of key=value pairs
	// that travels with HeaderTraceParent.
	HeaderTraceState = "tracestate"
)
