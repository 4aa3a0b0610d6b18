package forward

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// decodeAck reads a JetStream answer to a publish or a fast batch into a.
// The usual answer, a PubAck ({"stream":"EVENTS","seq":42}, with
// "duplicate", "domain", "batch" and "count" when they apply), is a flat
// object of plain values; it is read here without encoding/json, whose
// reflection was a large share of the bridge's CPU per event when every
// event is answered on its own. Anything else (an error, a string with
// escapes, a key not listed) goes to encoding/json.
func decodeAck(data []byte, a *batchAck) error {
	if decodeFlatAck(data, a) {
		return nil
	}
	*a = batchAck{}
	return json.Unmarshal(data, a)
}

// decodeFlatAck is decodeAck's fast path: false when data is not a flat
// object of the PubAck's plain keys (a may then be partly set).
func decodeFlatAck(data []byte, a *batchAck) bool {
	d := bytes.TrimSpace(data)
	if len(d) < 2 || d[0] != '{' || d[len(d)-1] != '}' {
		return false
	}
	d = bytes.TrimSpace(d[1 : len(d)-1])
	for len(d) > 0 {
		key, rest, ok := flatString(d)
		if !ok {
			return false
		}
		rest = bytes.TrimSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return false
		}
		rest = bytes.TrimSpace(rest[1:])
		var val []byte
		if i := bytes.IndexByte(rest, ','); i >= 0 {
			val, d = bytes.TrimSpace(rest[:i]), bytes.TrimSpace(rest[i+1:])
			if len(d) == 0 {
				return false // a trailing comma
			}
		} else {
			val, d = bytes.TrimSpace(rest), nil
		}
		switch string(key) {
		case "type", "stream", "batch", "domain":
			s, tail, ok := flatString(val)
			if !ok || len(tail) != 0 {
				return false
			}
			switch string(key) {
			case "type":
				a.Type = string(s)
			case "stream":
				a.Stream = string(s)
			case "batch":
				a.Batch = string(s)
			}
		case "seq":
			n, err := strconv.ParseUint(string(val), 10, 64)
			if err != nil {
				return false
			}
			a.Sequence = n
		case "count":
			n, err := strconv.Atoi(string(val))
			if err != nil {
				return false
			}
			a.Count = n
		case "duplicate":
			switch string(val) {
			case "true":
				a.Duplicate = true
			case "false":
				a.Duplicate = false
			default:
				return false
			}
		default:
			return false
		}
	}
	return true
}

// flatString reads a JSON string without escapes at the start of d: its
// contents and what follows it.
func flatString(d []byte) (s, rest []byte, ok bool) {
	if len(d) < 2 || d[0] != '"' {
		return nil, nil, false
	}
	end := bytes.IndexByte(d[1:], '"')
	if end < 0 {
		return nil, nil, false
	}
	s = d[1 : 1+end]
	if bytes.IndexByte(s, '\\') >= 0 {
		return nil, nil, false
	}
	return s, d[2+end:], true
}
