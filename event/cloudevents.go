package event

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
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
