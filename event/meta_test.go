package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jsbridge/jsbridge/wire"
)

// The meta → header rule: what ce-correlationid and ce-causationid carry for
// each shape of stored meta ("" means the header is left out). The README's
// "Subjects and headers" section states the same rule.
func TestParseMetaHeaderRule(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                   string
		meta                   string
		correlation, causation string // header values, percent-encoded
	}{
		{"NULL or empty", ``, "", ""},
		{"empty object", `{}`, "", ""},
		{"strings", `{"correlation": "c-0", "causation": "e-41"}`, "c-0", "e-41"},
		{"jsonb spacing", "{\"causation\":\n\t\"x\" ,\"correlation\" : \"y\"}", "y", "x"},
		{"number", `{"correlation": 7, "causation": -1.5e3}`, "7", "-1.5e3"},
		{"object compacted and encoded", `{"correlation": "c-0", "causation": {}}`, "c-0", "{}"},
		{"nested object", `{"causation": {"id": "e 1", "by": [1, 2]}}`, "", `{%22id%22:%22e%201%22,%22by%22:[1,2]}`},
		{"array", `{"correlation": ["a", "b"]}`, `[%22a%22,%22b%22]`, ""},
		{"booleans", `{"correlation": true, "causation": false}`, "true", "false"},
		{"null and empty string: no header", `{"correlation": null, "causation": ""}`, "", ""},
		{"escaped string unescaped then encoded", `{"correlation": "caf\u00e9 \"x\"\n"}`, "caf%C3%A9%20%22x%22%0A", ""},
		{"percent in a string", `{"correlation": "50%"}`, "50%25", ""},
		{"extra keys ignored", `{"correlation": "c", "tenant": {"id": 9, "tags": ["a"]}, "user": "u"}`, "c", ""},
		{"key case-insensitive, last wins", `{"Correlation": "upper", "correlation": "lower"}`, "lower", ""},
		{"key case-insensitive, last wins (upper last)", `{"correlation": "lower", "CORRELATION": "upper"}`, "upper", ""},
		{"escaped key", `{"c\u006frrelation": "esc"}`, "esc", ""},
		{"strings holding braces and quotes", `{"x": "}{\\\"", "y": [{"z": "]"}], "causation": "after"}`, "", "after"},
		{"key case-insensitive", `{"CAUSATION": "up"}`, "", "up"},
		{"duplicate key: last wins", `{"correlation": "a", "correlation": "b"}`, "b", ""},
		{"top-level array", `[{"correlation": "c"}]`, "", ""},
		{"top-level string", `"c-0"`, "", ""},
		{"top-level number", `42`, "", ""},
		{"top-level null", `null`, "", ""},
		{"top-level true, spaced", " \ttrue\n", "", ""},
		{"object after whitespace", "\n {\"correlation\": 1}", "1", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m, err := ParseMeta([]byte(c.meta))
			if err != nil {
				t.Fatalf("ParseMeta(%q): %v", c.meta, err)
			}
			if got := wire.EncodeHeaderValue(m.Correlation); got != c.correlation {
				t.Errorf("correlation header of %q = %q, want %q", c.meta, got, c.correlation)
			}
			if got := wire.EncodeHeaderValue(m.Causation); got != c.causation {
				t.Errorf("causation header of %q = %q, want %q", c.meta, got, c.causation)
			}
			// A header value decodes back to the id.
			if back, err := wire.DecodeHeaderValue(wire.EncodeHeaderValue(m.Correlation)); err != nil || back != m.Correlation {
				t.Errorf("correlation %q does not round-trip: %q, %v", m.Correlation, back, err)
			}
		})
	}
}

func TestParseMetaRejectsInvalidJSON(t *testing.T) {
	t.Parallel()
	for _, meta := range []string{
		`{"correlation": "c-0"`,
		`{"correlation": c-0}`,
		`not json`,
		`[1, 2`,
		`{} {}`,
		`{"correlation": "secret-value", }`,
		"\x00",
	} {
		_, err := ParseMeta([]byte(meta))
		if err == nil {
			t.Errorf("ParseMeta(%q): no error", meta)
			continue
		}
		if !strings.Contains(err.Error(), "not valid JSON") {
			t.Errorf("ParseMeta(%q): %v, want it to say not valid JSON", meta, err)
		}
		if strings.Contains(err.Error(), "secret-value") {
			t.Errorf("ParseMeta(%q): the error quotes the value: %v", meta, err)
		}
	}
	_, err := ParseMeta([]byte(`{"a": 1, "correlation": x}`))
	if err == nil || !strings.Contains(err.Error(), "at byte 25") {
		t.Errorf("the error names the offset: %v", err)
	}
}

func TestColumnErrorNamesColumnAndTable(t *testing.T) {
	t.Parallel()
	reason := errors.New("is NULL")
	err := error(&ColumnError{Table: "app.events", Column: "data", Err: reason})
	if err.Error() != "column data of app.events: is NULL" {
		t.Errorf("Error() = %q", err.Error())
	}
	if !errors.Is(err, reason) {
		t.Error("ColumnError does not unwrap to its reason")
	}
}

func BenchmarkParseMeta(b *testing.B) {
	for _, c := range []struct{ name, meta string }{
		{"empty", `{}`},
		{"strings", `{"causation": "e-5678", "correlation": "c-1234"}`},
		{"object", `{"causation": {"id": "e-5678"}, "correlation": 7, "tenant": {"id": 9}}`},
	} {
		raw := []byte(c.meta)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseMeta(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzParseMeta checks the hand-written scan against encoding/json: for
// valid meta, the same ids as decoding into RawMessage fields and
// compacting; for invalid meta, an error. (Non-ASCII keys are left out:
// encoding/json folds a few of them, such as the Kelvin sign, to ASCII.)
func FuzzParseMeta(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"correlation": "c", "causation": {"a": [1, {"b": "}"}]}}`, `[1]`, `"s"`, `{"CoRrElAtIoN": 1e5}`,
		`{"correlation": "a\"b", "x": "\\", "causation": null}`, `{"correlation": {"causation": "inner"}}`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, c := range raw {
			if c >= 0x80 {
				return
			}
		}
		got, err := ParseMeta(raw)
		if !json.Valid(raw) {
			if len(bytes.TrimSpace(raw)) > 0 && err == nil {
				t.Fatalf("ParseMeta(%q): no error for invalid JSON", raw)
			}
			return
		}
		if err != nil {
			t.Fatalf("ParseMeta(%q): %v", raw, err)
		}
		var want Meta
		var ids struct {
			Correlation json.RawMessage `json:"correlation"`
			Causation   json.RawMessage `json:"causation"`
		}
		if json.Unmarshal(raw, &ids) == nil {
			want.Correlation, want.Causation = refID(t, ids.Correlation), refID(t, ids.Causation)
		}
		if got != want {
			t.Fatalf("ParseMeta(%q) = %+v, encoding/json gives %+v", raw, got, want)
		}
	})
}

func refID(t *testing.T, raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The examples in docs/wire.md's table of meta → headers hold, and are there.
func TestWireDocMetaExamples(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct{ value, header string }{
		{`"c 1"`, `c%201`}, {`7`, `7`}, {`{}`, `{}`}, {`{"id": "e-1"}`, `{%22id%22:%22e-1%22}`},
	} {
		shown := "`" + ex.value + "` → `" + ex.header + "`"
		if !strings.Contains(string(readme), shown) {
			t.Errorf("docs/wire.md does not show %s", shown)
		}
		m, err := ParseMeta([]byte(`{"correlation": ` + ex.value + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := wire.EncodeHeaderValue(m.Correlation); got != ex.header {
			t.Errorf("meta value %s gives header %q, docs/wire.md says %q", ex.value, got, ex.header)
		}
	}
}

// An app that appends in a traced request stores the trace context at the
// top level of meta; ParseMeta hands it to the bridge, under the keys the
// CloudEvents distributed tracing extension and W3C Trace Context use.
func TestParseMetaTraceContext(t *testing.T) {
	t.Parallel()
	if MetaTraceParent != wire.HeaderTraceParent || MetaTraceState != wire.HeaderTraceState {
		t.Fatalf("meta keys %q, %q differ from the headers %q, %q", MetaTraceParent, MetaTraceState, wire.HeaderTraceParent, wire.HeaderTraceState)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m, err := ParseMeta([]byte(`{"correlation": "c", "traceparent": "` + tp + `", "TraceState": "k=v"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.TraceParent != tp || m.TraceState != "k=v" || m.Correlation != "c" {
		t.Errorf("ParseMeta = %+v", m)
	}
	// Append stores Meta with the same keys, so it reads back the same.
	raw, err := json.Marshal(Meta{TraceParent: tp, TraceState: "k=v"})
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseMeta(raw)
	if err != nil || back.TraceParent != tp || back.TraceState != "k=v" {
		t.Errorf("round trip of %s: %+v, %v", raw, back, err)
	}
}
