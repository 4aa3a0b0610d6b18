package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A run that writes the results file keeps the history it finds there and
// adds its own line of headline ratios.
func TestHistoryKeptAndExtended(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if got := readHistory(path); got != historyHeading+"\n\n"+historyHeader {
		t.Fatalf("readHistory of a missing file = %q", got)
	}
	old := "# Benchmarks\n\n| row |\n\n" + historyHeading + "\n\n" + historyHeaderV1 + "| 2026-11-23 19:34 | abc | full | 0.71 | 0.58 | 0.68, 0.72 | p50 14.74 ms, p99 53.38 ms (712 events/s achieved) | ? |\n\n"
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	h := readHistory(path)
	if !strings.HasPrefix(h, historyHeading+"\n\n"+historyHeader) || !strings.HasSuffix(h, "| ? |\n") {
		t.Fatalf("readHistory = %q, want the old lines under the current header", h)
	}
	rows := []row{
		{Name: "drain throughput: 1000000 events", Ratio: "0.80"},
		{Name: "consumer throughput: 200000 messages", Ratio: "0.95"},
		{Name: "ordered delivery, 1 replica(s): …", Ratio: "0.90 (whole run 0.50)"},
		{Name: "end to end: append → webhook received", Ours: "p50 5 ms, p99 9 ms (1000 events/s achieved)"},
		consumerCPU{deliveries: 1000, consumer: 120 * time.Millisecond, receiver: 100 * time.Millisecond}.row(),
	}
	line := historyLine(config{}, rows, t.TempDir())
	if got, want := strings.Count(line, "|"), strings.Count(strings.SplitN(historyHeader, "\n", 2)[0], "|"); got != want {
		t.Errorf("historyLine has %d cell borders, the header %d: %q", got, want, line)
	}
	for _, want := range []string{
		"| ? | full | 0.80 | 0.95 | 0.90 (whole run 0.50), — | p50 5 ms, p99 9 ms (1000 events/s achieved) |",
		"| 1.20 (consumer 120.0 µs/delivery) |\n",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("historyLine = %q, want it to contain %q", line, want)
		}
	}
}

// The bridge's mean durations come from its histograms' _sum and _count,
// added over their label sets.
func TestHistogramSumCount(t *testing.T) {
	t.Parallel()
	text := `# HELP jsbridge_bridge_ack_duration_seconds x
jsbridge_bridge_ack_duration_seconds_bucket{le="0.001"} 3
jsbridge_bridge_ack_duration_seconds_sum 0.5
jsbridge_bridge_ack_duration_seconds_count 100
jsbridge_bridge_ack_duration_seconds_sum{x="b"} 0.25
jsbridge_bridge_ack_duration_seconds_count{x="b"} 50
jsbridge_bridge_claim_duration_seconds_sum 9
`
	sum, count, err := histogramSumCount(strings.NewReader(text), "jsbridge_bridge_ack_duration_seconds")
	if err != nil || sum != 0.75 || count != 150 {
		t.Fatalf("histogramSumCount = %v, %v, %v; want 0.75, 150, nil", sum, count, err)
	}
}
