package deploy_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// ruleFile is Prometheus's rule file format (the fields rulefmt accepts),
// decoded strictly so that a misspelt key fails.
type ruleFile struct {
	Groups []struct {
		Name        string `yaml:"name"`
		Interval    string `yaml:"interval"`
		QueryOffset string `yaml:"query_offset"`
		Limit       int    `yaml:"limit"`
		Rules       []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// templateFuncs names the functions Prometheus offers alert templates;
// parsing needs only the names.
var templateFuncs = func() template.FuncMap {
	fm := template.FuncMap{}
	for _, f := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
		"humanizeTimestamp", "query", "first", "label", "value", "sortByLabel", "title", "toUpper",
		"toLower", "reReplaceAll", "match", "args", "safeHtml", "pathPrefix", "externalURL",
		"strvalue", "graphLink", "tableLink", "toTime", "parseDuration", "stripPort", "stripDomain"} {
		fm[f] = func(...any) any { return nil }
	}
	return fm
}()

// templateDefs are the variables Prometheus defines before an alert's
// template text.
const templateDefs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

var (
	alertName  = regexp.MustCompile(`^Jsbridge[A-Z][A-Za-z]+$`)
	labelsUsed = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	aggregated = regexp.MustCompile(`\b(?:sum|max|min|avg|count|topk|bottomk|quantile|stddev|stdvar|group)\s*(?:\(|by\b|without\b)`)
	// command is an admin command an annotation tells the reader to run.
	command = regexp.MustCompile("`(bridge|consumer) ([a-z]+(?: [a-z]+)?)")
)

// TestAlertRules reads deploy/prometheus/alerts.yml as Prometheus would and
// checks each alert: a unique name, an expression over exported metrics
// and labels, a valid for: duration, a severity, a summary and a
// description that parse as templates and use only labels the expression
// keeps.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&f), "prometheus/alerts.yml")
	exp := exported(t)
	readme, err := os.ReadFile("../docs/cli.md")
	require.NoError(t, err)

	groups, alerts := map[string]bool{}, map[string]bool{}
	for _, g := range f.Groups {
		require.NotEmpty(t, g.Name)
		require.False(t, groups[g.Name], "group %s twice", g.Name)
		groups[g.Name] = true
		require.NotEmpty(t, g.Rules, "group %s has no rules", g.Name)
		for _, r := range g.Rules {
			require.Empty(t, r.Record, "group %s: only alerting rules here", g.Name)
			require.Regexp(t, alertName, r.Alert)
			require.False(t, alerts[r.Alert], "alert %s twice", r.Alert)
			alerts[r.Alert] = true

			_, problems := checkExpr(r.Expr, exp)
			for _, p := range problems {
				t.Errorf("alert %s: %s\n\t%s", r.Alert, p, r.Expr)
			}
			require.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), "alert %s: unbalanced parentheses", r.Alert)
			require.NotEmpty(t, r.For, "alert %s: no for:", r.Alert)
			_, err := model.ParseDuration(r.For)
			require.NoError(t, err, "alert %s: for: %q", r.Alert, r.For)
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "alert %s: severity", r.Alert)

			// Labels an annotation may use: those the expression keeps,
			// its grouping labels when it aggregates, else every label of
			// its series.
			var keeps []string
			for _, grp := range grouping.FindAllStringSubmatch(r.Expr, -1) {
				for _, l := range strings.Split(grp[1], ",") {
					keeps = append(keeps, strings.TrimSpace(l))
				}
			}
			if !aggregated.MatchString(r.Expr) {
				keeps = append(keeps, targetLabels...)
				for _, name := range metricName.FindAllString(r.Expr, -1) {
					if base, ok := resolve(name, exp); ok {
						keeps = append(keeps, exp[base].labels...)
					}
				}
			}
			for _, key := range []string{"summary", "description"} {
				text := r.Annotations[key]
				require.NotEmpty(t, text, "alert %s: no %s", r.Alert, key)
				_, err := template.New(r.Alert).Funcs(templateFuncs).Parse(templateDefs + text)
				require.NoError(t, err, "alert %s: %s", r.Alert, key)
				for _, m := range labelsUsed.FindAllStringSubmatch(text, -1) {
					require.Contains(t, keeps, m[1], "alert %s: %s uses $labels.%s, which the expression drops", r.Alert, key, m[1])
				}
				// A command the reader is told to run is one docs/cli.md documents.
				for _, m := range command.FindAllStringSubmatch(text, -1) {
					require.Contains(t, string(readme), m[1]+" "+m[2], "alert %s: %s names `%s %s`", r.Alert, key, m[1], m[2])
				}
			}
		}
	}
	for _, want := range []string{"JsbridgeStreamBlocked", "JsbridgeForwardingBehind", "JsbridgeBreakerOpen",
		"JsbridgeDeadLetters", "JsbridgePublishErrors"} {
		require.True(t, alerts[want], "alert %s missing", want)
	}
}
