package forward

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jsbridge/jsbridge/event"
)

// ErrInvalidSubject is returned (wrapped) by ParseSubject and UnescapeToken
// when a subject or token is not one that Subject or EscapeToken produces.
var ErrInvalidSubject = errors.New("invalid subject")

// ErrInvalidPrefix is returned (wrapped) by New and Provision when the
// subject prefix is not a valid literal NATS subject.
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

// Subject returns the subject an event of stream with event name name is
// published on: "<prefix>.<category>.<stream>.<name>", where category is
// event.Category(stream) and the last three tokens are escaped with
// EscapeToken. prefix is used as is (it is configuration, validated by New
// and Provision). Example: Subject("events", "order-42", "OrderPlaced") is
// "events.order.order-42.OrderPlaced".
func Subject(prefix, stream, name string) string {
	cat := event.Category(stream)
	var b strings.Builder
	b.Grow(len(prefix) + 3 + escapedLen(cat) + escapedLen(stream) + escapedLen(name))
	b.WriteString(prefix)
	b.WriteByte('.')
	appendEscaped(&b, cat)
	b.WriteByte('.')
	appendEscaped(&b, stream)
	b.WriteByte('.')
	appendEscaped(&b, name)
	return b.String()
}

// ParseSubject reverses Subject: it returns the stream and event name of a
// subject under prefix. It fails (wrapping ErrInvalidSubject) when subject
// does not start with prefix + ".", does not have exactly three tokens after
// it, a token is not in EscapeToken's canonical form, or the category token
// is not the category of the stream.
func ParseSubject(prefix, subject string) (stream, name string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with prefix %q", ErrInvalidSubject, subject, prefix+".")
	}
	toks := strings.Split(rest, ".")
	if len(toks) != 3 {
		return "", "", fmt.Errorf("%w: %q has %d tokens after prefix %q, want 3 (category.stream.name)", ErrInvalidSubject, subject, len(toks), prefix)
	}
	var names [3]string
	for i, tok := range toks {
		if names[i], err = UnescapeToken(tok); err != nil {
			return "", "", fmt.Errorf("parse subject %q: %w", subject, err)
		}
	}
	if cat := event.Category(names[1]); cat != names[0] {
		return "", "", fmt.Errorf("%w: %q: category token %q is not the category %q of stream %q", ErrInvalidSubject, subject, toks[0], cat, names[1])
	}
	return names[1], names[2], nil
}

// CategoryFilter returns the subject filter matching every event of every
// stream in category: "<prefix>.<category>.>".
func CategoryFilter(prefix, category string) string {
	return prefix + "." + EscapeToken(category) + ".>"
}

// StreamFilter returns the subject filter matching every event of one
// stream: "<prefix>.<category>.<stream>.>".
func StreamFilter(prefix, stream string) string {
	return prefix + "." + EscapeToken(event.Category(stream)) + "." + EscapeToken(stream) + ".>"
}

// NameFilter returns the subject filter matching every event with event name
// name, in any stream: "<prefix>.*.*.<name>".
func NameFilter(prefix, name string) string {
	return prefix + ".*.*." + EscapeToken(name)
}

// validPrefix checks that prefix is a literal subject: non-empty tokens,
// no wildcards, no whitespace or control bytes.
func validPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty", ErrInvalidPrefix)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" {
			return fmt.Errorf("%w: %q has an empty token", ErrInvalidPrefix, prefix)
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f || c == '*' || c == '>' {
				return fmt.Errorf("%w: %q contains %q (wildcard, whitespace or control byte)", ErrInvalidPrefix, prefix, c)
			}
		}
	}
	return nil
}
