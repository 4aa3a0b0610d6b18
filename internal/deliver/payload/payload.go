// Package payload turns a stored message into a webhook's body: the
// event's CloudEvents attributes read from the message's headers, the
// body in structured mode (the CloudEvents JSON envelope, built once per
// event and shared by its webhooks) or in binary mode (the data, the
// attributes as ce-* headers), as docs/wire.md describes. It is a pure
// function of the message and the subscription's mode: no clock, no I/O.
package payload

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// errMalformed marks a message deliver cannot turn into a webhook.
var errMalformed = errors.New("malformed message")

// HeaderValue returns the first value of key in h, matching the exact key first
// and then case-insensitively (publishers may canonicalize names).
func HeaderValue(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// EventID is the event id of a message with headers h: its
// Nats-Msg-Id, else its ce-id ("" when it has neither).
func EventID(h nats.Header) string {
	if id := HeaderValue(h, wire.HeaderMsgID); id != "" {
		return id
	}
	return HeaderValue(h, wire.HeaderID)
}

// Build returns the request body of the event id, stored as a message
// with headers mh and data, for a subscription in mode, and sets the
// request's headers on h: Content-Type and, in binary mode, the ce-*
// attributes; the body is then data itself, never checked. In structured
// mode data is embedded in the CloudEvents JSON envelope, so it must be
// JSON: an error wrapping errMalformed says it is not, or that an
// attribute cannot be decoded. env, when not nil, is the event's
// (reader.Event.Envelope): the structured body is built, and its data
// checked, by the event's first webhook, and shared by the others (every
// subscription in structured mode, every retry); nil builds it anew.
func Build(mode subscription.BodyMode, id string, mh nats.Header, data []byte, env *reader.Envelope, h http.Header) ([]byte, error) {
	if mode == subscription.BodyBinary {
		for k, vs := range mh {
			if len(vs) > 0 && wire.IsCEHeader(k) {
				h.Set(k, vs[0])
			}
		}
		h.Set(wire.HeaderID, id)
		if h.Get(wire.HeaderSpecVersion) == "" {
			h.Set(wire.HeaderSpecVersion, event.SpecVersion)
		}
		h.Set(wire.HeaderContentType, contentTypeOf(mh))
		return data, nil
	}
	body, err := env.Body(func() ([]byte, error) { return structured(id, mh, data) })
	if err != nil {
		return nil, err
	}
	h[wire.HeaderContentType] = contentTypeCloudEvents
	return body, nil
}

// contentTypeOf is the data's content type as the message's headers
// name it, application/json when they do not.
func contentTypeOf(mh nats.Header) string {
	if ct := HeaderValue(mh, wire.HeaderContentType); ct != "" {
		return ct
	}
	return event.ContentTypeJSON
}

// structured is the CloudEvents JSON envelope of the event id with
// headers mh and data: a pure function of the event, the same bytes for
// every subscription. An error wrapping errMalformed says an attribute
// cannot be decoded or data is not JSON.
func structured(id string, mh nats.Header, data []byte) ([]byte, error) {
	// Header values are percent-encoded (forward uses
	// wire.EncodeHeaderValue); the JSON envelope carries them decoded.
	var decodeErr error
	attr := func(name string) string {
		v, err := wire.DecodeHeaderValue(HeaderValue(mh, name))
		if err != nil && decodeErr == nil {
			decodeErr = fmt.Errorf("%w: %s: %w", errMalformed, name, err)
		}
		return v
	}
	ce := event.CloudEvent{
		SpecVersion:     HeaderValue(mh, wire.HeaderSpecVersion),
		ID:              id,
		Source:          attr(wire.HeaderSource),
		Type:            attr(wire.HeaderType),
		Subject:         attr(wire.HeaderSubject),
		Time:            HeaderValue(mh, wire.HeaderTime),
		DataContentType: contentTypeOf(mh),
		CorrelationID:   attr(wire.HeaderCorrelationID),
		CausationID:     attr(wire.HeaderCausationID),
	}
	if decodeErr != nil {
		return nil, decodeErr
	}
	if ce.SpecVersion == "" {
		ce.SpecVersion = event.SpecVersion
	}
	if v := HeaderValue(mh, wire.HeaderStreamVersion); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q is not an integer", errMalformed, wire.HeaderStreamVersion, v)
		}
		ce.StreamVersion = n
	}
	if len(data) > 0 && !json.Valid(data) {
		return nil, fmt.Errorf("%w: data is not JSON, cannot embed it in a structured-mode body", errMalformed)
	}
	ce.Data = data
	return ce.AppendJSON(make([]byte, 0, 256+len(data))), nil
}

// contentTypeCloudEvents is the Content-Type value of a structured-mode
// body, shared by every request (the transport only reads it).
var contentTypeCloudEvents = []string{event.ContentTypeCloudEventsJSON}
