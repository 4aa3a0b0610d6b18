package attemptlog

import (
	"encoding/json"
	"testing"
	"time"
)

// TestAppendJSONMatchesMarshal: the hand-written encoding of a record is
// byte for byte encoding/json's, so `consumer trace` and any other reader
// see the same records as before.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 26, 1, 2, 3, 456789000, time.UTC)
	strs := []string{"", "orders", "a\"b\\c", "<tag>&amp;", "line\nfeed\ttab\rcr\bbs\fff", "\x00\x01\x1f\x7f",
		"héllo wörld ✓", "bad \xff utf8 \xc3", "sep \u2028 and \u2029", "emoji 😀", "HTTP 503 Service Unavailable"}
	var cases []Attempt
	for _, s := range strs {
		cases = append(cases,
			Attempt{Subscription: s, EventID: "42", Attempt: 1, At: at, Replica: "host/1", Status: 204, StatusClass: "2xx", Outcome: "ack",
				Latency: 1234567 * time.Nanosecond, Breaker: "closed", Subject: "events.order.order-1.Placed", StreamSeq: 7},
			Attempt{Subscription: "s", EventID: s, Attempt: -3, At: at.In(time.FixedZone("x", 3600)), Replica: s, Status: 0, StatusClass: s,
				Outcome: s, Latency: -1, Error: s, Breaker: s, Subject: s, StreamSeq: 1<<64 - 1, TraceID: s},
		)
	}
	cases = append(cases, Attempt{}, Attempt{At: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)})
	for _, a := range cases {
		want, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := a.appendJSON(nil)
		if !ok || string(got) != string(want) {
			t.Errorf("appendJSON(%+v) = %s, %v; want %s", a, got, ok, want)
		}
	}
	if _, ok := (Attempt{At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}).appendJSON(nil); ok {
		t.Error("appendJSON of year 10000 reported ok; encoding/json refuses it")
	}
}

func BenchmarkAttemptJSON(b *testing.B) {
	a := Attempt{Subscription: "orders", EventID: "123456", Attempt: 1, At: time.Now().UTC(), Replica: "host/1", Status: 204,
		StatusClass: "2xx", Outcome: "ack", Latency: 1234567, Breaker: "closed", Subject: "events.order.order-1.Placed", StreamSeq: 7}
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(a)
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = a.appendJSON(make([]byte, 0, 320))
		}
	})
}
