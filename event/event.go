// Package event holds the event type that the store, the drain and the
// forwarder all speak. It has no dependencies, so any of them can import it
// without pulling in Postgres or NATS (as River keeps rivertype).
package event

import (
	"time"
)

// Event is one stored event of the common event-store layout.
type Event struct {
	// ID is the global event id: unique, and increasing in commit order
	// within a stream. It is the Nats-Msg-Id and the Idempotency-Key.
	ID int64
	// Stream is the name of the stream the event belongs to, e.g. "order-42".
	Stream string
	// Version is the event's 0-based position in its stream.
	Version int64
	// Name is the event type, e.g. "OrderPlaced".
	Name string
	// Data is the event payload exactly as stored (JSON), byte for byte.
	Data []byte
	// Meta carries the correlation and causation ids (see ParseMeta).
	Meta Meta
	// Created is when the event was appended.
	Created time.Time
	// DataJSON reports that Data is known to be valid JSON without looking:
	// the store read it from a jsonb column (the bridge's own events table).
	// The forwarder then skips its own check (encoding/json.Valid, a sixth
	// of the bridge's CPU per event at full speed). False (the zero value)
	// means "check it".
	DataJSON bool
	// Err, when not nil, says why the store could not read the row as an
	// event (a *ColumnError: NULL data, meta that is not valid JSON). Such
	// an event is never forwarded: the drain blocks its stream at it,
	// keeping the progress before it, and the forwarder refuses it.
	Err error
}

// Meta is the metadata of an event that the bridge forwards: the ids out of
// the events table's meta column (ParseMeta says how any JSON maps to them).
// Appending, it is stored as {"correlation": ..., "causation": ...}.
type Meta struct {
	// Correlation ties together every event caused by one original request.
	// Read from stored meta, it is a string member's value or the compact
	// JSON of any other value (ParseMeta).
	Correlation string `json:"correlation,omitempty"`
	// Causation is the id of the message that directly caused this event;
	// read like Correlation.
	Causation string `json:"causation,omitempty"`
	// TraceParent is the W3C Trace Context traceparent of the operation
	// that appended the event, e.g.
	// "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; the
	// bridge's publish span continues that trace. Stored under the meta key
	// MetaTraceParent, as the CloudEvents distributed tracing extension
	// names the attribute. Empty: the bridge starts a trace per event.
	// A value that is not a valid traceparent is ignored.
	TraceParent string `json:"traceparent,omitempty"`
	// TraceState is the W3C tracestate that goes with TraceParent (meta key
	// MetaTraceState); ignored without TraceParent.
	TraceState string `json:"tracestate,omitempty"`
}

// Meta keys of the trace context, at the top level of an event's meta
// (the attribute names of the CloudEvents distributed tracing extension,
// and the W3C Trace Context header names wire.HeaderTraceParent and
// wire.HeaderTraceState, which a test checks they equal).
const (
	MetaTraceParent = "traceparent"
	MetaTraceState  = "tracestate"
)
