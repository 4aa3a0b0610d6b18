// Package event holds the event type that the store, the drain and the
// forwarder all speak. It has no dependencies, so any of them can import it
// without pulling in Postgres or NATS (as River keeps rivertype).
package event

import (
	"strings"
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
	// Meta carries the correlation and causation ids.
	Meta Meta
	// Created is when the event was appended.
	Created time.Time
}

// Meta is the metadata stored with an event (the events table's meta jsonb).
type Meta struct {
	// Correlation ties together every event caused by one original request.
	Correlation string `json:"correlation,omitempty"`
	// Causation is the id of the message that directly caused this event.
	Causation string `json:"causation,omitempty"`
}

// Category returns the part of a stream name before its first "-", the usual
// event-store convention: "order-42" is in category "order". A stream name
// without "-" is its own category.
func Category(stream string) string {
	if i := strings.IndexByte(stream, '-'); i >= 0 {
		return stream[:i]
	}
	return stream
}
