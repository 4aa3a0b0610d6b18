package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// manyCaseNames is cases as "<what> on <nodes>".
func manyCaseNames(cases []manyCase) []string {
	var out []string
	for _, c := range cases {
		out = append(out, c.what()+" on "+map[int]string{1: "1", 3: "3"}[c.nodes])
	}
	return out
}

// The full run has the mixed case on the cluster beside 1,000 ordered
// there; -many-sizes and -many-mix pick their cases alone; quick has no
// mixed case.
func TestManyCasesPickTheMixedCase(t *testing.T) {
	full := config{ManyMix: [2]int{10_000, 1000}}
	got := manyCaseNames((&env{cfg: full}).manyCases())
	for _, want := range []string{
		"10000 unordered and 1000 ordered together on 3",
		"1000 (ordering stream) on 3",
		"10000 (ordering none) on 3",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("full run: no %q in %q", want, got)
		}
	}

	picked := config{ManyMix: [2]int{100, 10}, ManyNodes: 1, ManyPicked: true}
	got = manyCaseNames((&env{cfg: picked}).manyCases())
	want := []string{"100 unordered and 10 ordered together on 1"}
	if !slices.Equal(got, want) {
		t.Errorf("-many-mix 100,10 -many-nodes 1: %q, want %q", got, want)
	}

	quick := config{Quick: true}
	got = manyCaseNames((&env{cfg: quick}).manyCases())
	if want := []string{"100 (ordering none) on 1"}; !slices.Equal(got, want) {
		t.Errorf("quick: %q, want %q", got, want)
	}
}

// A mixed case's last subscriptions are the ordered ones.
func TestManyCaseOrdersItsLastSubscriptions(t *testing.T) {
	c := manyCase{subs: 11, ordered: 1}
	if c.ordering(9) != "none" || c.ordering(10) != "stream" || !c.mixed() {
		t.Fatalf("subs 11, ordered 1: ordering(9) %s, ordering(10) %s, mixed %v", c.ordering(9), c.ordering(10), c.mixed())
	}
	if all := (manyCase{subs: 5, ordered: 5}); all.mixed() || all.ordering(0) != "stream" || all.ordering(5) != "stream" {
		t.Fatalf("all ordered: mixed %v, ordering(0) %s, ordering(5) %s", all.mixed(), all.ordering(0), all.ordering(5))
	}
	// The subscription a row adds (index subs) keeps the row's ordering.
	if none := (manyCase{subs: 5}); none.ordering(5) != "none" || c.ordering(11) != "stream" {
		t.Fatalf("added: unordered row %s, mixed row %s", none.ordering(5), c.ordering(11))
	}
}

// The ratio is the CPU per webhook with one subscription ÷ with many,
// the consumer's alone and with the server's.
func TestThroughputRatios(t *testing.T) {
	one := throughputFigures{webhooks: 1000, window: time.Second, consumer: 100 * time.Millisecond, server: 20 * time.Millisecond}
	many := throughputFigures{webhooks: 2000, window: time.Second, consumer: 250 * time.Millisecond, server: 10 * time.Millisecond}
	cons, both := throughputRatios(one, many)
	// 100 µs ÷ 125 µs; 120 µs ÷ 130 µs.
	if cons != 0.8 || both < 0.923 || both > 0.924 {
		t.Fatalf("ratios %.3f, %.3f; want 0.800, 0.923", cons, both)
	}
	if one.rate() != 1000 || !strings.Contains(one.String(), "consumer 100.0 µs, server 20.0 µs") {
		t.Fatalf("rate %.0f, %q", one.rate(), one)
	}
	if cons, both := throughputRatios(one, throughputFigures{}); cons != 0 || both != 0 {
		t.Fatalf("no webhooks in the window: ratios %.2f, %.2f; want 0", cons, both)
	}
}
