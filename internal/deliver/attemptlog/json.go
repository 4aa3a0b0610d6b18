package attemptlog

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON appends a as JSON, byte for byte what encoding/json's Marshal
// gives for Attempt (the same keys, order, omitempty, time format and
// string escaping; attempt_json_test.go compares them). One record is
// written per delivery attempt: reflection was ~3 % of the consumer's CPU
// at full speed.
func (a Attempt) appendJSON(b []byte) ([]byte, bool) {
	b = append(b, `{"subscription":`...)
	b = appendString(b, a.Subscription)
	b = append(b, `,"event_id":`...)
	b = appendString(b, a.EventID)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(a.Attempt), 10)
	b = append(b, `,"at":`...)
	// time.Time.MarshalJSON refuses years outside [0,9999]; so do we
	// (the caller falls back to encoding/json, which reports it).
	if y := a.At.Year(); y < 0 || y > 9999 {
		return b, false
	}
	b = append(b, '"')
	b = a.At.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","replica":`...)
	b = appendString(b, a.Replica)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(a.Status), 10)
	b = append(b, `,"status_class":`...)
	b = appendString(b, a.StatusClass)
	b = append(b, `,"outcome":`...)
	b = appendString(b, a.Outcome)
	b = append(b, `,"latency_ns":`...)
	b = strconv.AppendInt(b, int64(a.Latency), 10)
	if a.Error != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, a.Error)
	}
	b = append(b, `,"breaker":`...)
	b = appendString(b, a.Breaker)
	b = append(b, `,"subject":`...)
	b = appendString(b, a.Subject)
	b = append(b, `,"stream_seq":`...)
	b = strconv.AppendUint(b, a.StreamSeq, 10)
	if a.TraceID != "" {
		b = append(b, `,"trace_id":`...)
		b = appendString(b, a.TraceID)
	}
	return append(b, '}'), true
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string escaped as encoding/json does
// with HTML escaping on (its default): ", \ and control characters, <, >
// and &, U+2028 and U+2029; invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
