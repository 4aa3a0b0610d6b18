package deploy_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/jsbridge/jsbridge/forward"
)

// These regular expressions read what the tests check in a PromQL
// expression; they are not a PromQL parser (the prometheus module is far
// too heavy a dependency for that), so the dashboard and the rules keep to
// plain selectors and "by (…)" clauses.
var (
	metricName = regexp.MustCompile(`jsbridge_[a-z_]+`)
	// selector: a jsbridge metric with its label matchers.
	selector = regexp.MustCompile(`(jsbridge_[a-z_]+)\s*\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*$`)
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// knownValues are the label values the code defines, where a selector
// naming another value would match nothing.
var knownValues = map[string][]string{
	"class": {forward.ClassTooLarge, forward.ClassInvalidData, forward.ClassTimeout, forward.ClassCanceled,
		forward.ClassNoResponders, forward.ClassConnection, forward.ClassNotAttempted, forward.ClassConflict, forward.ClassOther},
}

// histogramSuffixes are the series a histogram exports besides its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// resolve maps a series name used in an expression to its metric family:
// the name itself, or a histogram's name without its series suffix.
func resolve(name string, exp map[string]metric) (string, bool) {
	if _, ok := exp[name]; ok {
		return name, true
	}
	for _, s := range histogramSuffixes {
		base, ok := strings.CutSuffix(name, s)
		if ok && exp[base].typ == dto.MetricType_HISTOGRAM {
			return base, true
		}
	}
	return "", false
}

// checkExpr returns what is wrong with expr against the exported metrics:
// an unknown metric, a selector's label the metric lacks or a value the
// code never sets, a "by (…)" label none of its metrics has. It also
// returns the metric families expr uses.
func checkExpr(expr string, exp map[string]metric) (used []string, problems []string) {
	labels := slices.Clone(targetLabels)
	for _, name := range metricName.FindAllString(expr, -1) {
		base, ok := resolve(name, exp)
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is not exported by the bridge or the consumer", name))
			continue
		}
		used = append(used, base)
		labels = append(labels, exp[base].labels...)
		if strings.HasSuffix(name, "_bucket") {
			labels = append(labels, "le")
		}
	}
	for _, sel := range selector.FindAllStringSubmatch(expr, -1) {
		base, ok := resolve(sel[1], exp)
		if !ok {
			continue // reported above
		}
		have := append(slices.Clone(targetLabels), exp[base].labels...)
		for _, part := range strings.Split(sel[2], ",") {
			if strings.TrimSpace(part) == "" {
				continue
			}
			m := matcher.FindStringSubmatch(part)
			if m == nil {
				problems = append(problems, fmt.Sprintf("selector %s: cannot read matcher %q", sel[1], part))
				continue
			}
			if !slices.Contains(have, m[1]) {
				problems = append(problems, fmt.Sprintf("selector %s: label %q is not one of %v", sel[1], m[1], have))
			}
			if known, ok := knownValues[m[1]]; ok && !strings.Contains(m[3], "$") {
				for _, v := range strings.Split(m[3], "|") {
					if !slices.Contains(known, v) {
						problems = append(problems, fmt.Sprintf("selector %s: %s value %q is not one of %v", sel[1], m[1], v, known))
					}
				}
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(labels, l) {
				problems = append(problems, fmt.Sprintf("grouping label %q is on none of the expression's metrics (%v)", l, labels))
			}
		}
	}
	return used, problems
}
