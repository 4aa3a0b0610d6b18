package event

import (
	"encoding/json"
	"reflect"
	"strings"
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

func FuzzCloudEventAppendJSON(f *testing.F) {
	f.Add("order-42", "OrderPlaced", "corr\n\"1\"", "caf\xe9", int64(7), `{"a": [1, 2], "b": "<&>"}`)
	f.Fuzz(func(t *testing.T, subject, typ, corr, cause string, version int64, data string) {
		ce := CloudEvent{SpecVersion: SpecVersion, ID: "1", Source: "jsbridge", Type: typ, Subject: subject,
			Time: "2026-01-02T03:04:05Z", DataContentType: ContentTypeJSON, StreamVersion: version,
			CorrelationID: corr, CausationID: cause}
		if json.Valid([]byte(data)) {
			ce.Data = json.RawMessage(data)
		}
		got := ce.AppendJSON(nil)
		var back CloudEvent
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendJSON gave invalid JSON %q: %v", got, err)
		}
		// What encoding/json makes of the same strings (invalid UTF-8 → U+FFFD).
		var want CloudEvent
		wantJSON, _ := json.Marshal(ce)
		if err := json.Unmarshal(wantJSON, &want); err != nil {
			t.Fatal(err)
		}
		want.Data, back.Data = nil, nil
		if !reflect.DeepEqual(want, back) {
			t.Fatalf("round trip: got %+v, want %+v", back, want)
		}
		if len(ce.Data) > 0 && !strings.Contains(string(got), `"data":`+string(ce.Data)+"}") {
			t.Fatalf("data not verbatim at the end: %q", got)
		}
	})
}
