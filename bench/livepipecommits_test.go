package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Write commits are the transaction ids given beyond the appends'; the
// read-only ones the rest of xact_commit.
func TestSplitCommits(t *testing.T) {
	before := liveXacts{commits: 5000, xmax: 900, walSyncs: 10}
	// 1,000 appends; 50 more transactions wrote; 700 more were
	// read-only; 400 WAL flushes.
	after := liveXacts{commits: 5000 + 1000 + 50 + 700, xmax: 900 + 1000 + 50, walSyncs: 410}
	got := splitCommits(before, after, 1000)
	want := liveCommitSplit{all: 0.75, write: 0.05, readOnly: 0.7, walSyncs: 0.4}
	if math.Abs(got.all-want.all) > 1e-9 || math.Abs(got.write-want.write) > 1e-9 || math.Abs(got.readOnly-want.readOnly) > 1e-9 || math.Abs(got.walSyncs-want.walSyncs) > 1e-9 {
		t.Fatalf("splitCommits = %+v, want %+v", got, want)
	}
	// Rolled-back writers have ids and no commit: read-only never < 0.
	// WAL flushes unknown on either side: -1.
	after = liveXacts{commits: 5000 + 1000, xmax: 900 + 1000 + 10, walSyncs: -1}
	if got := splitCommits(before, after, 1000); got.readOnly != 0 || math.Abs(got.write-0.01) > 1e-9 || got.walSyncs != -1 {
		t.Fatalf("splitCommits with rollbacks = %+v, want write 0.01, read-only 0", got)
	}
	f := livePipeFigures{events: 1000, commits: 1750}
	if got := f.writeCommitsPerEvent(); math.Abs(got-0.75) > 1e-9 {
		t.Fatalf("writeCommitsPerEvent without the split = %v, want xact_commit's 0.75", got)
	}
	f.split, f.splitKnown = splitCommits(liveXacts{}, liveXacts{commits: 1750, xmax: 1050}, 1000), true
	if got := f.writeCommitsPerEvent(); math.Abs(got-0.05) > 1e-9 {
		t.Fatalf("writeCommitsPerEvent = %v, want 0.05", got)
	}
}

// Each of the store's statements the bridge runs is told by its text.
func TestStatementKind(t *testing.T) {
	for _, c := range []struct{ query, want string }{
		{"WITH h AS (\n SELECT ... INSERT INTO s.events (stream, version, name, data, meta)", "appends"},
		{"WITH m AS MATERIALIZED (\n    SELECT a.ctid AS at, a.stream, a.version, a.created FROM s.appended a ...", "fold"},
		{"WITH due AS MATERIALIZED (...) ... LEFT JOIN LATERAL (...)", "claim+fetch"},
		{"WITH due AS MATERIALIZED (...) SELECT stream", "claim"},
		{"SELECT ... FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(stream, watermark, ord)", "fetch"},
		{"WITH a AS (...) UPDATE s.streams s SET watermark = GREATEST(s.watermark, a.version), retry = $7, leased_by = $10", "ack"},
		{"UPDATE s.streams s SET watermark = GREATEST(watermark, $3), retry = retry + $7, next_attempt = now()", "other"},
		{"UPDATE s.streams s SET head = t.top, pending_since = ...", "catch-up"},
		{"SELECT set_config('lock_timeout', $1, true)", "lock_timeout"},
		{"SELECT set_config($1, $2, $3)", "lock_timeout"},
		{"SELECT pg_advisory_unlock(hashtextextended($1, 0))", "idle/busy"},
		{"SELECT pg_notify('s', '')", "wake"},
		{"UPDATE s.streams SET leased_by = NULL, leased_until = NULL, updated_at = now() WHERE ... RETURNING stream", "release"},
		{"UPDATE s.bare_position SET id = $1", "bare"},
		{"SELECT id, stream FROM s.events WHERE id > $1 ORDER BY id LIMIT 1000", "bare"},
		{"SELECT 1", "other"},
	} {
		if got := statementKind(c.query); got != c.want {
			t.Errorf("statementKind(%q) = %q, want %q", c.query, got, c.want)
		}
	}
}

// By kind: what each entry did between the two reads, per event.
func TestStatementsByKind(t *testing.T) {
	before := map[int64]liveStatementEntry{
		1: {kind: "claim", liveStatement: liveStatement{calls: 10, time: time.Millisecond}},
	}
	after := map[int64]liveStatementEntry{
		1: {kind: "claim", liveStatement: liveStatement{calls: 110, time: 11 * time.Millisecond}},
		2: {kind: "idle/busy", liveStatement: liveStatement{calls: 50, time: 2 * time.Millisecond}},
		3: {kind: "claim", liveStatement: liveStatement{calls: 100, time: 10 * time.Millisecond}},
	}
	got := statementsByKind(before, after)
	if got["claim"] != (liveStatement{calls: 200, time: 20 * time.Millisecond}) || got["idle/busy"] != (liveStatement{calls: 50, time: 2 * time.Millisecond}) {
		t.Fatalf("statementsByKind = %+v", got)
	}
	line := statementsLine(got, 1000)
	if want := "per event: claim 0.200 calls, 20.0 µs; idle/busy 0.050 calls, 2.0 µs"; line != want {
		t.Fatalf("statementsLine = %q, want %q", line, want)
	}
	if statementsLine(nil, 1000) != "none" {
		t.Fatal("statementsLine(nil) is not none")
	}
}

// The bridge's histograms: read from the exposition, less the reading
// before, and their quantiles interpolated inside a bucket.
func TestBridgeHistogramQuantile(t *testing.T) {
	text := func(a, b, c, inf int) string {
		return strings.NewReplacer("{a}", itoa(a), "{b}", itoa(b), "{c}", itoa(c), "{i}", itoa(inf)).Replace(`# TYPE jsbridge_bridge_claim_duration_seconds histogram
jsbridge_bridge_claim_duration_seconds_bucket{le="0.001"} {a}
jsbridge_bridge_claim_duration_seconds_bucket{le="0.002"} {b}
jsbridge_bridge_claim_duration_seconds_bucket{le="0.004"} {c}
jsbridge_bridge_claim_duration_seconds_bucket{le="+Inf"} {i}
jsbridge_bridge_claim_duration_seconds_count {i}
`)
	}
	h0, err := readHistogram(strings.NewReader(text(5, 5, 5, 5)), "jsbridge_bridge_claim_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	h1, err := readHistogram(strings.NewReader(text(55, 95, 105, 105)), "jsbridge_bridge_claim_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	h := h1.since(h0) // 50 ≤ 1 ms, 40 in (1, 2], 10 in (2, 4]
	if h.count != 100 {
		t.Fatalf("count = %v, want 100", h.count)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, time.Millisecond}, {0.7, 1500 * time.Microsecond}, {0.95, 3 * time.Millisecond}, {1, 4 * time.Millisecond}} {
		if got := h.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if (histogram{}).quantile(0.99) != 0 {
		t.Error("the quantile of an empty histogram is not 0")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
