package event

import (
	"testing"
	"unicode/utf8"
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
		got := EncodeHeaderValue(in)
		if got != want {
			t.Errorf("EncodeHeaderValue(%q) = %q, want %q", in, got, want)
		}
		back, err := DecodeHeaderValue(got)
		if err != nil || back != in {
			t.Errorf("DecodeHeaderValue(%q) = %q, %v; want %q", got, back, err, in)
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "a%G0"} {
		if _, err := DecodeHeaderValue(bad); err == nil {
			t.Errorf("DecodeHeaderValue(%q) accepted a bad escape", bad)
		}
	}
}

func FuzzHeaderValueRoundTrip(f *testing.F) {
	for _, s := range []string{"order-1", "a b", "\r\n", "é", "%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := EncodeHeaderValue(s)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c <= ' ' || c >= 0x7f || c == '"' {
				t.Fatalf("EncodeHeaderValue(%q) = %q holds byte %#x", s, enc, c)
			}
		}
		if !utf8.ValidString(enc) {
			t.Fatalf("not UTF-8: %q", enc)
		}
		back, err := DecodeHeaderValue(enc)
		if err != nil || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, err)
		}
	})
}
