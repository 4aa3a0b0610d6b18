package wire_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jsbridge/jsbridge/wire"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
)

func TestHeaderValueEncoding(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"order-42":      "order-42",
		"OrderPlaced":   "OrderPlaced",
		"a b":           "a%20b",
		"50%":           "50%25",
		`say "hi"`:      "say%20%22hi%22",
		"line\r\nbreak": "line%0D%0Abreak",
		"café":          "caf%C3%A9",
		"":              "",
		"tab\there":     "tab%09here",
		"events.*.>":    "events.*.>",
	}
	for in, want := range cases {
		got := wire.EncodeHeaderValue(in)
		if got != want {
			t.Errorf("EncodeHeaderValue(%q) = %q, want %q", in, got, want)
		}
		back, err := wire.DecodeHeaderValue(got)
		if err != nil || back != in {
			t.Errorf("DecodeHeaderValue(%q) = %q, %v; want %q", got, back, err, in)
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "a%G0"} {
		if _, err := wire.DecodeHeaderValue(bad); err == nil {
			t.Errorf("DecodeHeaderValue(%q) accepted a bad escape", bad)
		}
	}
}

func FuzzHeaderValueRoundTrip(f *testing.F) {
	for _, s := range []string{"order-1", "a b", "\r\n", "é", "%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := wire.EncodeHeaderValue(s)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c <= ' ' || c >= 0x7f || c == '"' {
				t.Fatalf("EncodeHeaderValue(%q) = %q holds byte %#x", s, enc, c)
			}
		}
		if !utf8.ValidString(enc) {
			t.Fatalf("not UTF-8: %q", enc)
		}
		back, err := wire.DecodeHeaderValue(enc)
		if err != nil || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, err)
		}
	})
}

// The NATS header names are the ones nats.go's jetstream package sends and
// the server reads; a typo here would silently drop deduplication or the
// bridge's fence.
func TestNATSHeadersMatchJetStream(t *testing.T) {
	t.Parallel()
	for ours, theirs := range map[string]string{
		wire.HeaderMsgID:                              jetstream.MsgIDHeader,
		wire.HeaderExpectedStream:                     jetstream.ExpectedStreamHeader,
		wire.HeaderExpectedLastSubjectSequence:        jetstream.ExpectedLastSubjSeqHeader,
		wire.HeaderExpectedLastSubjectSequenceSubject: jetstream.ExpectedLastSubjSeqSubjHeader,
	} {
		if ours != theirs {
			t.Errorf("wire spells %q, nats.go %q", ours, theirs)
		}
	}
	for _, h := range []string{wire.HeaderMsgID, wire.HeaderExpectedStream, wire.HeaderExpectedLastSubjectSequence, wire.HeaderExpectedLastSubjectSequenceSubject} {
		if !strings.HasPrefix(h, wire.HeaderPrefixNATS) {
			t.Errorf("%q lacks the prefix %q", h, wire.HeaderPrefixNATS)
		}
	}
}

func TestIsCEHeader(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]bool{"ce-id": true, "Ce-Type": true, "CE-SOURCE": true, "ce-": false, "Content-Type": false, "ce": false, "Nats-Msg-Id": false} {
		if got := wire.IsCEHeader(h); got != want {
			t.Errorf("IsCEHeader(%q) = %v, want %v", h, got, want)
		}
	}
}

func TestIdempotencyKeyIsEventID(t *testing.T) {
	t.Parallel()
	if got := wire.IdempotencyKey("42"); got != "42" {
		t.Errorf("IdempotencyKey(42) = %q, want the event id", got)
	}
}

// The trace headers are the ones OpenTelemetry's W3C propagator writes:
// deliver and forward inject with it and must find them under these names.
func TestTraceHeadersMatchOpenTelemetry(t *testing.T) {
	t.Parallel()
	fields := propagation.TraceContext{}.Fields()
	want := []string{wire.HeaderTraceParent, wire.HeaderTraceState}
	if len(fields) != len(want) {
		t.Fatalf("propagation.TraceContext fields %q, want %q", fields, want)
	}
	for i := range want {
		if fields[i] != want[i] {
			t.Errorf("propagation.TraceContext field %d = %q, wire spells %q", i, fields[i], want[i])
		}
	}
}

func TestAttemptSubject(t *testing.T) {
	t.Parallel()
	if got := wire.AttemptSubject("attempts", "orders", "42"); got != "attempts.orders.42" {
		t.Errorf("AttemptSubject = %q", got)
	}
	if got := wire.AttemptSubject("attempts", "orders", "a.b"); got != "attempts.orders.a%2Eb" {
		t.Errorf("AttemptSubject escapes the event id: %q", got)
	}
	if got := wire.AttemptFilter("attempts", "42"); got != "attempts.*.42" {
		t.Errorf("AttemptFilter = %q", got)
	}
}
