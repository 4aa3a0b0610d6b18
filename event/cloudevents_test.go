package event

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

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
