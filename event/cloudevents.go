package event

import (
	"encoding/json"
	"strconv"
	"time"
)

// CloudEvents attribute headers, as the CloudEvents NATS and HTTP bindings
// (binary content mode) name them: "ce-" plus the attribute name. Forward
// sets them on every JetStream message; deliver copies them onto binary-mode
// webhooks. Source: CloudEvents spec v1.0, nats-protocol-binding.md and
// http-protocol-binding.md.
const (
	HeaderSpecVersion = "ce-specversion"
	HeaderID          = "ce-id"
	HeaderType        = "ce-type"
	HeaderSource      = "ce-source"
	HeaderSubject     = "ce-subject"
	HeaderTime        = "ce-time"
	// HeaderStreamVersion carries the extension attribute streamversion: the
	// event's 0-based version in its stream.
	HeaderStreamVersion = "ce-streamversion"
	// HeaderCorrelationID carries the extension attribute correlationid.
	HeaderCorrelationID = "ce-correlationid"
	// HeaderCausationID carries the extension attribute causationid.
	HeaderCausationID = "ce-causationid"
	// HeaderContentType is the content type of the data (binary mode).
	HeaderContentType = "Content-Type"
)

// SpecVersion is the CloudEvents version jsbridge speaks.
const SpecVersion = "1.0"

// ContentTypeJSON is the content type of event data.
const ContentTypeJSON = "application/json"

// ContentTypeCloudEventsJSON is the content type of a structured-mode body.
const ContentTypeCloudEventsJSON = "application/cloudevents+json"

// CloudEvent is the structured-mode CloudEvents JSON envelope of one event:
// the default webhook body, and what receivers decode.
type CloudEvent struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Subject         string `json:"subject,omitempty"`
	Time            string `json:"time,omitempty"`
	DataContentType string `json:"datacontenttype,omitempty"`
	// StreamVersion is the extension attribute streamversion.
	StreamVersion int64 `json:"streamversion"`
	// CorrelationID is the extension attribute correlationid.
	CorrelationID string `json:"correlationid,omitempty"`
	// CausationID is the extension attribute causationid.
	CausationID string `json:"causationid,omitempty"`
	// Data is the event data, byte for byte.
	Data json.RawMessage `json:"data,omitempty"`
}

// FormatID formats an event id as it appears in ce-id, Nats-Msg-Id and
// Idempotency-Key: base-10 digits.
func FormatID(id int64) string { return strconv.FormatInt(id, 10) }

// FormatTime formats a creation time as ce-time does: RFC 3339 in UTC with
// nanoseconds.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
