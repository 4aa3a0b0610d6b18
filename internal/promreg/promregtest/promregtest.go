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
	if len(labels)%2 != 0 {
		t.Fatalf("promregtest.Value(%s, %q): labels are pairs of name and value", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if has(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			}
		}
	}
	return sum
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
