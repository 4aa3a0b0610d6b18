package wire

import (
	"fmt"
	"strings"
)

// Subject returns the subject an event of stream with event name name is
// published on: "<prefix>.<category>.<stream>.<name>", where category is
// Category(stream) and the last three tokens are escaped with
// EscapeToken. prefix is used as is (it is configuration, validated by
// ValidatePrefix). Example: Subject("events", "order-42", "OrderPlaced") is
// "events.order.order-42.OrderPlaced".
func Subject(prefix, stream, name string) string {
	cat := Category(stream)
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
	if cat := Category(names[1]); cat != names[0] {
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
	return prefix + "." + EscapeToken(Category(stream)) + "." + EscapeToken(stream) + ".>"
}

// NameFilter returns the subject filter matching every event with event name
// name, in any stream: "<prefix>.*.*.<name>".
func NameFilter(prefix, name string) string {
	return prefix + ".*.*." + EscapeToken(name)
}

// ValidatePrefix checks that prefix is a literal subject: non-empty tokens,
// no wildcards, no whitespace or control bytes. The error wraps
// ErrInvalidPrefix and names the prefix.
func ValidatePrefix(prefix string) error {
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

// Category returns the part of a stream name before its first "-", the usual
// event-store convention: "order-42" is in category "order". A stream name
// without "-" is its own category. It is the second token of a subject.
func Category(stream string) string {
	if i := strings.IndexByte(stream, '-'); i >= 0 {
		return stream[:i]
	}
	return stream
}

// StreamKey returns the part of a subject that names one source stream:
// everything before its last token (the event name), e.g.
// "events.order.order-42" for "events.order.order-42.OrderPlaced". Two
// events of one stream always share it and events of different streams
// never do; unlike ParseSubject it needs no prefix and does not unescape,
// so the consumer can key its per-stream lanes by it on every message. A
// subject without "." is its own key.
func StreamKey(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[:i]
	}
	return subject
}

// DLQSubject returns the subject a dead letter of subscription is stored
// on: "<prefix>.<subscription>.<original subject>", the original subject
// kept whole (its tokens are already escaped), "unknown" when there is
// none. Subscription names are validated by deliver to be one token.
func DLQSubject(prefix, subscription, original string) string {
	if original == "" {
		original = "unknown"
	}
	return prefix + "." + subscription + "." + original
}

// DLQFilter returns the filter matching the dead letters of subscription,
// "<prefix>.<subscription>.>", or of every subscription when subscription is
// empty: "<prefix>.>".
func DLQFilter(prefix, subscription string) string {
	if subscription == "" {
		return All(prefix)
	}
	return prefix + "." + subscription + ".>"
}

// AttemptSubject returns the subject of an attempt record of an event's
// delivery to subscription: "<prefix>.<subscription>.<event id>", the
// event id escaped with EscapeToken (an event id is base-10 digits, kept as
// is; anything else a foreign publisher put in Nats-Msg-Id is escaped).
// Subscription names are validated by deliver to be one token.
func AttemptSubject(prefix, subscription, eventID string) string {
	return prefix + "." + subscription + "." + EscapeToken(eventID)
}

// AttemptFilter returns the filter matching the attempt records of one
// event for every subscription: "<prefix>.*.<event id escaped>". The
// subject index of the stream finds them without reading the others.
func AttemptFilter(prefix, eventID string) string {
	return prefix + ".*." + EscapeToken(eventID)
}

// IntersectFilters returns the subject filter matching exactly the subjects
// both filters a and b match (tokens "*" and ">" as in NATS), and false when
// no subject matches both. E.g. "events.*.*.OrderPlaced" and
// "events.order.order-42.*" give "events.order.order-42.OrderPlaced".
func IntersectFilters(a, b string) (string, bool) {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	out := make([]string, 0, max(len(at), len(bt)))
	for i := 0; ; i++ {
		switch {
		case i == len(at) && i == len(bt):
			return strings.Join(out, "."), true
		case i < len(at) && at[i] == ">" && i < len(bt):
			return strings.Join(append(out, bt[i:]...), "."), true
		case i < len(bt) && bt[i] == ">" && i < len(at):
			return strings.Join(append(out, at[i:]...), "."), true
		case i == len(at) || i == len(bt):
			return "", false
		case at[i] == "*":
			out = append(out, bt[i])
		case bt[i] == "*" || at[i] == bt[i]:
			out = append(out, at[i])
		default:
			return "", false
		}
	}
}
