package wire

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidSubject is returned (wrapped) by ParseSubject and UnescapeToken
// when a subject or token is not one that Subject or EscapeToken produces.
var ErrInvalidSubject = errors.New("invalid subject")

// ErrInvalidPrefix is returned (wrapped) by ValidatePrefix (and so by
// forward.New and forward.Provision) when a subject prefix is not a valid
// literal NATS subject.
var ErrInvalidPrefix = errors.New("invalid subject prefix")

// EmptyToken is the reserved token that stands for an empty category, stream
// or event name. EscapeToken never produces a lone "%" for anything else,
// because every other "%" it writes is followed by two hex digits.
const EmptyToken = "%"

const upperHex = "0123456789ABCDEF"

// safeByte reports whether b is kept as is in a token: [A-Za-z0-9_-].
func safeByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '_' || b == '-'
}

// escapedLen returns the length of EscapeToken(s).
func escapedLen(s string) int {
	if s == "" {
		return len(EmptyToken)
	}
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !safeByte(s[i]) {
			n += 2
		}
	}
	return n
}

// appendEscaped writes EscapeToken(s) to b.
func appendEscaped(b *strings.Builder, s string) {
	if s == "" {
		b.WriteString(EmptyToken)
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0x0f])
	}
}

// Two percent-encodings live here, each from its own source:
//
//   - EscapeToken (subject tokens): NATS subjects split on '.', treat '*'
//     and '>' as wildcards and forbid whitespace, so a token keeps only
//     [A-Za-z0-9_-] and encodes every other byte, with uppercase hex and one
//     canonical form, so that a stream's subject and its filters agree.
//   - EncodeHeaderValue (ce-* header values): the CloudEvents HTTP protocol
//     binding, v1.0, section 3.1.3.2, encodes space, '"', '%', control and
//     non-ASCII bytes and nothing else, so ordinary values read as they are.
//
// The rules differ on purpose ('.' or '*' is fine in a header value, a
// space is fine in neither); do not use one for the other.

// EscapeToken turns any string (a category, stream or event name) into one
// valid, wildcard-free NATS subject token: bytes in [A-Za-z0-9_-] are kept,
// every other byte (".", "*", ">", whitespace, "%", control bytes, each byte
// of a non-ASCII character) becomes %XX with uppercase hex, and the empty
// string becomes EmptyToken ("%"). The mapping is one to one;
// UnescapeToken reverses it. Use it to build subscription filters, e.g.
// "events." + EscapeToken("order") + ".>".
func EscapeToken(s string) string {
	n := escapedLen(s)
	if n == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(n)
	appendEscaped(&b, s)
	return b.String()
}

// UnescapeToken reverses EscapeToken. It accepts only the canonical form
// EscapeToken produces, so every accepted token maps back to itself: an
// empty token, a "%" not followed by two uppercase hex digits, an escaped
// byte that needs no escaping, or a byte outside [A-Za-z0-9_-%] is an error
// wrapping ErrInvalidSubject.
func UnescapeToken(tok string) (string, error) {
	if tok == EmptyToken {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("%w: empty token", ErrInvalidSubject)
	}
	if !strings.Contains(tok, "%") {
		for i := 0; i < len(tok); i++ {
			if !safeByte(tok[i]) {
				return "", fmt.Errorf("%w: token %q: byte %#02x at %d must be escaped", ErrInvalidSubject, tok, tok[i], i)
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if safeByte(c) {
			out = append(out, c)
			continue
		}
		if c != '%' {
			return "", fmt.Errorf("%w: token %q: byte %#02x at %d must be escaped", ErrInvalidSubject, tok, c, i)
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("%w: token %q: truncated escape at %d", ErrInvalidSubject, tok, i)
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: token %q: escape %q at %d is not %%XX with uppercase hex", ErrInvalidSubject, tok, tok[i:i+3], i)
		}
		d := byte(hi<<4 | lo)
		if safeByte(d) {
			return "", fmt.Errorf("%w: token %q: escape %q at %d encodes %q, which is never escaped", ErrInvalidSubject, tok, tok[i:i+3], i, d)
		}
		out = append(out, d)
		i += 2
	}
	return string(out), nil
}

// unhex returns the value of an uppercase hex digit, or -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

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

// headerByteNeedsEscape is EncodeHeaderValue's rule for one byte.
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
		if i+2 >= len(s) || unhexAny(s[i+1]) < 0 || unhexAny(s[i+2]) < 0 {
			return "", fmt.Errorf("header value %q: bad percent-encoding at byte %d", s, i)
		}
		b = append(b, byte(unhexAny(s[i+1])<<4|unhexAny(s[i+2])))
		i += 2
	}
	return string(b), nil
}

// unhexAny returns the value of a hex digit of either case, or -1.
func unhexAny(c byte) int {
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
