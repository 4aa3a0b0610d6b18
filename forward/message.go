package forward

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// Message returns the JetStream message for e, as Publish sends it:
//
//   - Subject: wire.Subject(cfg.Prefix, e.Stream, e.Name).
//   - Nats-Msg-Id: event.FormatID(e.ID), so JetStream drops a re-publish
//     inside the duplicate window.
//   - CloudEvents binary mode headers (CloudEvents v1.0 NATS protocol
//     binding): ce-specversion "1.0", ce-id (the event id), ce-type (the event
//     name), ce-source (cfg.Source), ce-subject (the stream), ce-time
//     (event.FormatTime(e.Created)), Content-Type application/json,
//     ce-streamversion (the version, base 10), and ce-correlationid /
//     ce-causationid when e.Meta has them (non-empty; read from stored meta
//     of any JSON shape by event.ParseMeta: a string id as it is, any other
//     value as its compact JSON). Free-text values (type, source,
//     subject, correlation, causation) are percent-encoded with
//     wire.EncodeHeaderValue, as the CloudEvents HTTP binding requires, so
//     the same headers can go out on a binary-mode webhook unchanged and a
//     name holding CR or LF cannot break the header block.
//   - Data: e.Data byte for byte (the slice is shared, not copied).
//
// Empty cfg.Prefix and cfg.Source take their defaults ("events", "jsbridge");
// no other field of cfg is used and nothing is validated here (New does).
func Message(e event.Event, cfg Config) *nats.Msg {
	msg := &nats.Msg{Header: make(nats.Header, 15)} // 11, and room for the expectations and the trace context
	fillMessage(msg, e, cfg)
	return msg
}

// fillMessage makes msg the message Message returns for e, reusing msg's
// header map (cleared first): a batch publishes its events one after the
// other through one message, since PublishMsg has copied the headers out
// by the time it returns.
func fillMessage(msg *nats.Msg, e event.Event, cfg Config) {
	prefix, source := cfg.Prefix, cfg.Source
	if prefix == "" {
		prefix = wire.DefaultEventsPrefix
	}
	if source == "" {
		source = DefaultSource
	}
	id := event.FormatID(e.ID)
	h := msg.Header
	if h == nil {
		h = make(nats.Header, 15)
	}
	clear(h)
	// One backing array for all values: each header gets a one-element,
	// capacity-capped slice of it, so a later Add cannot clobber a neighbour.
	vals := make([]string, 0, 11)
	set := func(k, v string) {
		vals = append(vals, v)
		n := len(vals)
		h[k] = vals[n-1 : n : n]
	}
	set(wire.HeaderMsgID, id)
	set(wire.HeaderSpecVersion, event.SpecVersion)
	set(wire.HeaderID, id)
	set(wire.HeaderType, wire.EncodeHeaderValue(e.Name))
	set(wire.HeaderSource, wire.EncodeHeaderValue(source))
	set(wire.HeaderSubject, wire.EncodeHeaderValue(e.Stream))
	set(wire.HeaderTime, event.FormatTime(e.Created))
	set(wire.HeaderContentType, event.ContentTypeJSON)
	set(wire.HeaderStreamVersion, strconv.FormatInt(e.Version, 10))
	if e.Meta.Correlation != "" {
		set(wire.HeaderCorrelationID, wire.EncodeHeaderValue(e.Meta.Correlation))
	}
	if e.Meta.Causation != "" {
		set(wire.HeaderCausationID, wire.EncodeHeaderValue(e.Meta.Causation))
	}
	*msg = nats.Msg{Subject: wire.Subject(prefix, e.Stream, e.Name), Header: h, Data: e.Data}
}
