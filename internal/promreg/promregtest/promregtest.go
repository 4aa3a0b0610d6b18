// Package promregtest reads metrics back in tests, as a registry
// gathers them: the one helper the engine's and the consumer's tests
// share instead of each walking the gathered families itself.
package promregtest

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the sum of the values (counter, gauge or untyped) of
// metric name's series whose labels include labels, given as pairs of
// label name and value (none: every series), as g gathers them now; 0
// when there is none (a vector with no series yet is not gathered). It
// fails t when labels is not pairs or g fails to gather.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range matching(t, g, name, labels) {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

// Series returns how many of metric name's series have labels (pairs of
// label name and value; none: every series), as g gathers them now. A
// test that expects a value of 0 asserts with it that the series is
// there, since Value reads 0 for a series that is not (a misspelled name
// included). It fails t as Value does.
func Series(t testing.TB, g prometheus.Gatherer, name string, labels ...string) int {
	t.Helper()
	return len(matching(t, g, name, labels))
}

// matching gathers g and returns metric name's series that have labels.
func matching(t testing.TB, g prometheus.Gatherer, name string, labels []string) []*dto.Metric {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("promregtest(%s, %q): labels are pairs of name and value", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if has(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out
}

// has reports whether m has every label of pairs.
func has(m *dto.Metric, pairs []string) bool {
	for i := 0; i < len(pairs); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == pairs[i] && l.GetValue() == pairs[i+1]
		}) {
			return false
		}
	}
	return true
}
