package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ParseMeta reads the ids the bridge forwards out of an event's stored meta
// (the events table's meta column, as JSON text). Frameworks put anything
// in meta, so any valid JSON passes:
//
//   - NULL or empty meta, or a top-level value that is not an object (an
//     array, a string, a number, true, false, null): no ids.
//   - an object: its members "correlation", "causation", "traceparent"
//     and "tracestate" (MetaTraceParent, MetaTraceState), keys matched
//     ASCII case-insensitively (as encoding/json matches struct fields), the
//     last one wins. A string member gives its value, unescaped; null or ""
//     gives no id; any other value (a number, true, false, an array, an
//     object) gives its compact JSON text, e.g. 7 → "7",
//     {"id": "c-1"} → `{"id":"c-1"}`. Other members are ignored: they stay
//     in Postgres. The ids have headers (forward.Message); the trace
//     context continues in the bridge's publish span.
//
// Meta that is not valid JSON is an error naming the reason and the byte
// offset; the value itself is not quoted (meta may hold personal data).
// It allocates only the ids it returns (none for "{}"): it runs once per
// forwarded event.
func ParseMeta(raw []byte) (Meta, error) {
	if len(raw) == 0 || len(raw) == 2 && raw[0] == '{' && raw[1] == '}' {
		return Meta{}, nil // NULL, empty, or the usual "{}": nothing to decode
	}
	if !json.Valid(raw) {
		return Meta{}, invalidJSON(raw, json.Unmarshal(raw, new(any)))
	}
	// Valid JSON from here on, so the scan below needs no error checks.
	i := skipSpace(raw, 0)
	if raw[i] != '{' {
		return Meta{}, nil
	}
	var corr, caus, tp, ts []byte
	i = skipSpace(raw, i+1)
	for raw[i] != '}' {
		kEnd := stringEnd(raw, i)
		key := raw[i+1 : kEnd-1]
		i = skipSpace(raw, kEnd) // at ':'
		i = skipSpace(raw, i+1)  // at the value
		vEnd := valueEnd(raw, i)
		switch {
		case keyIs(key, "correlation"):
			corr = raw[i:vEnd]
		case keyIs(key, "causation"):
			caus = raw[i:vEnd]
		case keyIs(key, MetaTraceParent):
			tp = raw[i:vEnd]
		case keyIs(key, MetaTraceState):
			ts = raw[i:vEnd]
		}
		i = skipSpace(raw, vEnd) // at ',' or '}'
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
	}
	var m Meta
	var err error
	if m.Correlation, err = metaID(corr); err != nil {
		return Meta{}, invalidJSON(raw, err)
	}
	if m.Causation, err = metaID(caus); err != nil {
		return Meta{}, invalidJSON(raw, err)
	}
	if m.TraceParent, err = metaID(tp); err != nil {
		return Meta{}, invalidJSON(raw, err)
	}
	if m.TraceState, err = metaID(ts); err != nil {
		return Meta{}, invalidJSON(raw, err)
	}
	return m, nil
}

// keyIs reports whether the raw (still escaped) key is name, ASCII
// case-insensitively; name is lowercase ASCII. A key with escapes is
// unescaped first.
func keyIs(key []byte, name string) bool {
	if bytes.IndexByte(key, '\\') >= 0 {
		var s string
		quoted := make([]byte, 0, len(key)+2)
		quoted = append(append(append(quoted, '"'), key...), '"')
		if json.Unmarshal(quoted, &s) != nil {
			return false
		}
		key = []byte(s)
	}
	if len(key) != len(name) {
		return false
	}
	for j := range key {
		c := key[j]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[j] {
			return false
		}
	}
	return true
}

// metaID turns one member's raw JSON value (valid) into the id: a string's
// value, or the compact JSON of any other value; "" for none or null.
func metaID(raw []byte) (string, error) {
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		if bytes.IndexByte(raw, '\\') < 0 {
			return string(raw[1 : len(raw)-1]), nil // no escapes: the bytes are the value
		}
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case raw[0] != '{' && raw[0] != '[':
		return string(raw), nil // a number, true or false: already compact
	}
	var b bytes.Buffer
	b.Grow(len(raw))
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace (len(b) when none).
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at b[i]
// (a '"'), which is valid.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // skip the escaped byte
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the valid JSON value starting at
// b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) { // a number, true, false or null
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// invalidJSON is ParseMeta's error for raw, which err found not valid.
func invalidJSON(raw []byte, err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("not valid JSON (%d bytes): %v at byte %d", len(raw), syn, syn.Offset)
	}
	return fmt.Errorf("not valid JSON (%d bytes): %w", len(raw), err)
}

// ColumnError is why a stored row could not be read as an event: which
// column of which events table, and why (a NULL where a value is required,
// text that is not valid JSON). It is the Err of such an event.
type ColumnError struct {
	// Table is the events table, schema-qualified, e.g. "app.events".
	Table string
	// Column is the column's name, e.g. "meta".
	Column string
	// Err is the reason.
	Err error
}

// Error returns "column <column> of <table>: <reason>".
func (e *ColumnError) Error() string {
	return fmt.Sprintf("column %s of %s: %v", e.Column, e.Table, e.Err)
}

// Unwrap returns the reason.
func (e *ColumnError) Unwrap() error { return e.Err }
