package event

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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

// EncodeHeaderValue percent-encodes a ce-* header value as the CloudEvents
// HTTP protocol binding (v1.0, section 3.1.3.2) requires: every byte that is
// a space, '"', '%', a control character or outside ASCII becomes %XX
// (uppercase hex). Other values come back unchanged, so ordinary names need
// no decoding. Forward applies it on JetStream too, so a stream or event name
// holding CR or LF cannot break a header block.
func EncodeHeaderValue(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if headerByteNeedsEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if headerByteNeedsEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func headerByteNeedsEscape(c byte) bool {
	return c <= ' ' || c >= 0x7f || c == '"' || c == '%'
}

// DecodeHeaderValue reverses EncodeHeaderValue. A '%' not followed by two
// hex digits is an error naming the value.
func DecodeHeaderValue(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
			return "", fmt.Errorf("header value %q: bad percent-encoding at byte %d", s, i)
		}
		b = append(b, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
		i += 2
	}
	return string(b), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// AppendJSON appends c as a structured-mode CloudEvents JSON object to dst:
// the fields of CloudEvent in order, empty optional attributes left out, and
// Data written verbatim (it must be valid JSON; encoding/json would compact
// and HTML-escape it, and the data must go out byte for byte). It is what
// json.Marshal would produce apart from that, without reflection: the
// consumer builds one per delivery.
func (c CloudEvent) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"specversion":`...)
	dst = appendJSONString(dst, c.SpecVersion)
	dst = append(dst, `,"id":`...)
	dst = appendJSONString(dst, c.ID)
	dst = append(dst, `,"source":`...)
	dst = appendJSONString(dst, c.Source)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, c.Type)
	opt := func(dst []byte, name, v string) []byte {
		if v == "" {
			return dst
		}
		dst = append(dst, ',', '"')
		dst = append(dst, name...)
		dst = append(dst, '"', ':')
		return appendJSONString(dst, v)
	}
	dst = opt(dst, "subject", c.Subject)
	dst = opt(dst, "time", c.Time)
	dst = opt(dst, "datacontenttype", c.DataContentType)
	dst = append(dst, `,"streamversion":`...)
	dst = strconv.AppendInt(dst, c.StreamVersion, 10)
	dst = opt(dst, "correlationid", c.CorrelationID)
	dst = opt(dst, "causationid", c.CausationID)
	if len(c.Data) > 0 {
		dst = append(dst, `,"data":`...)
		dst = append(dst, c.Data...)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string: '"' and '\' escaped, control
// characters as \n, \r, \t or \u00XX, invalid UTF-8 as U+FFFD (as
// encoding/json does).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
