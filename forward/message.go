package forward

import (
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/event"
)

// Message returns the JetStream message for e, as Publish sends it:
//
//   - Subject: Subject(cfg.Prefix, e.Stream, e.Name).
//   - Nats-Msg-Id: event.FormatID(e.ID), so JetStream drops a re-publish
//     inside the duplicate window.
//   - CloudEvents binary mode headers (CloudEvents v1.0 NATS protocol
//     binding): ce-specversion "1.0", ce-id (the event id), ce-type (the event
//     name), ce-source (cfg.Source), ce-subject (the stream), ce-time
//     (event.FormatTime(e.Created)), Content-Type application/json,
//     ce-streamversion (the version, base 10), and ce-correlationid /
//     ce-causationid when e.Meta has them.
//   - Data: e.Data byte for byte (the slice is shared, not copied).
//
// Empty cfg.Prefix and cfg.Source take their defaults ("events", "jsbridge");
// no other field of cfg is used and nothing is validated here (New does).
func Message(e event.Event, cfg Config) *nats.Msg {
	prefix, source := cfg.Prefix, cfg.Source
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if source == "" {
		source = DefaultSource
	}
	id := event.FormatID(e.ID)
	h := make(nats.Header, 11)
	h[jetstream.MsgIDHeader] = []string{id}
	h[event.HeaderSpecVersion] = []string{event.SpecVersion}
	h[event.HeaderID] = []string{id}
	h[event.HeaderType] = []string{e.Name}
	h[event.HeaderSource] = []string{source}
	h[event.HeaderSubject] = []string{e.Stream}
	h[event.HeaderTime] = []string{event.FormatTime(e.Created)}
	h[event.HeaderContentType] = []string{event.ContentTypeJSON}
	h[event.HeaderStreamVersion] = []string{strconv.FormatInt(e.Version, 10)}
	if e.Meta.Correlation != "" {
		h[event.HeaderCorrelationID] = []string{e.Meta.Correlation}
	}
	if e.Meta.Causation != "" {
		h[event.HeaderCausationID] = []string{e.Meta.Causation}
	}
	return &nats.Msg{
		Subject: Subject(prefix, e.Stream, e.Name),
		Header:  h,
		Data:    e.Data,
	}
}
