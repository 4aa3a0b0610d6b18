package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrNotCloudEvent is wrapped by DecodeCloudEvent when a request is neither a
// structured-mode nor a binary-mode CloudEvent, or lacks a required attribute.
var ErrNotCloudEvent = errors.New("not a CloudEvent")

// DecodeCloudEvent decodes the event a webhook carries, in either content
// mode of the CloudEvents HTTP binding (CloudEvents v1.0,
// http-protocol-binding.md):
//
//   - structured: Content-Type application/cloudevents+json (parameters
//     ignored); body is the JSON envelope of event.CloudEvent.
//   - binary: attributes in ce-* headers (wire.HeaderID and friends,
//     percent-decoded as the binding prescribes; an invalid escape is kept
//     as sent), Content-Type is datacontenttype, body is data byte for byte.
//     Data is empty when the body is.
//
// Either way specversion, id, source and type are required. Errors wrap
// ErrNotCloudEvent (no ce-specversion header and not structured, a missing
// attribute, a batch content type) or name the field that failed to parse.
func DecodeCloudEvent(r *http.Request, body []byte) (event.CloudEvent, error) {
	var ce event.CloudEvent
	mediaType := ""
	if ct := r.Header.Get(wire.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			return ce, fmt.Errorf("decode cloudevent: Content-Type %q: %w", ct, err)
		}
		mediaType = mt
	}
	switch {
	case mediaType == event.ContentTypeCloudEventsJSON:
		if err := json.Unmarshal(body, &ce); err != nil {
			return event.CloudEvent{}, fmt.Errorf("decode cloudevent: structured body: %w", err)
		}
	case strings.HasPrefix(mediaType, "application/cloudevents-batch"):
		return ce, fmt.Errorf("decode cloudevent: %w: batch mode (%s) is not supported", ErrNotCloudEvent, mediaType)
	case r.Header.Get(wire.HeaderSpecVersion) != "":
		ce = event.CloudEvent{
			SpecVersion:     headerValue(r.Header, wire.HeaderSpecVersion),
			ID:              headerValue(r.Header, wire.HeaderID),
			Source:          headerValue(r.Header, wire.HeaderSource),
			Type:            headerValue(r.Header, wire.HeaderType),
			Subject:         headerValue(r.Header, wire.HeaderSubject),
			Time:            headerValue(r.Header, wire.HeaderTime),
			DataContentType: r.Header.Get(wire.HeaderContentType),
			CorrelationID:   headerValue(r.Header, wire.HeaderCorrelationID),
			CausationID:     headerValue(r.Header, wire.HeaderCausationID),
		}
		if v := headerValue(r.Header, wire.HeaderStreamVersion); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return event.CloudEvent{}, fmt.Errorf("decode cloudevent: %s %q is not an integer: %w", wire.HeaderStreamVersion, v, err)
			}
			ce.StreamVersion = n
		}
		if len(body) > 0 {
			ce.Data = json.RawMessage(body)
		}
	default:
		return ce, fmt.Errorf("decode cloudevent: %w: Content-Type %q and no %s header", ErrNotCloudEvent, mediaType, wire.HeaderSpecVersion)
	}
	for _, req := range []struct{ name, value string }{
		{"specversion", ce.SpecVersion}, {"id", ce.ID}, {"source", ce.Source}, {"type", ce.Type},
	} {
		if req.value == "" {
			return event.CloudEvent{}, fmt.Errorf("decode cloudevent: %w: attribute %s is missing", ErrNotCloudEvent, req.name)
		}
	}
	return ce, nil
}

// headerValue returns the percent-decoded value of a ce-* header.
func headerValue(h http.Header, name string) string {
	v := h.Get(name)
	if !strings.Contains(v, "%") {
		return v
	}
	if d, err := wire.DecodeHeaderValue(v); err == nil {
		return d
	}
	return v
}
