package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// panel is what the tests read of a Grafana panel.
type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Legend     string `json:"legendFormat"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

const dsVar = "${datasource}"

// legendLabel is a label a legend format shows: {{name}}.
var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// variableRef is a dashboard variable used in an expression: $name or
// ${name}, Grafana's own $__ variables aside.
var variableRef = regexp.MustCompile(`\$\{?([a-zA-Z][a-zA-Z0-9_]*)`)

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("grafana/jsbridge.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d), "grafana/jsbridge.json")
	return d
}

// TestDashboardQueriesExportedMetrics: every query of the dashboard (panel
// targets and variable queries) names metrics and labels the binaries
// export, and every exported metric is shown on some panel.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	exp := exported(t)
	shown := map[string]bool{}
	check := func(where, expr string) {
		used, problems := checkExpr(expr, exp)
		for _, p := range problems {
			t.Errorf("%s: %s\n\t%s", where, p, expr)
		}
		for _, u := range used {
			shown[u] = true
		}
	}
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			check("panel "+p.Title+" "+tg.RefID, tg.Expr)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 20, "the dashboard's queries were not read")
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			q, ok := v.Query.(map[string]any)
			require.True(t, ok, "variable %s: query is not an object", v.Name)
			check("variable "+v.Name, q["query"].(string))
			check("variable "+v.Name, v.Definition)
		}
	}
	for name := range exp {
		require.True(t, shown[name], "metric %s is on no panel of the dashboard", name)
	}
}

// TestDashboardIsPortable: the dashboard picks its Prometheus through the
// ${datasource} variable on every panel and query, uses only variables it
// defines, uses every variable it defines, and its panels have unique
// titles and do not overlap.
func TestDashboardIsPortable(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	require.Equal(t, "jsbridge", d.UID)
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
		if v.Name == "datasource" {
			require.Equal(t, "datasource", v.Type)
			require.Equal(t, "prometheus", v.Query)
		}
	}
	require.True(t, defined["datasource"], "no datasource variable")
	require.True(t, defined["subscription"], "no subscription variable")
	require.True(t, defined["endpoint"], "no endpoint variable")

	used := map[string]bool{"datasource": true}
	ids, titles := map[int]bool{}, map[string]bool{}
	var boxes []panel
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d used twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.False(t, titles[p.Title], "panel title %q used twice", p.Title)
		titles[p.Title] = true
		boxes = append(boxes, p)
		require.NotNil(t, p.Datasource, "panel %s has no datasource", p.Title)
		require.Equal(t, dsVar, p.Datasource.UID, "panel %s", p.Title)
		require.Equal(t, "prometheus", p.Datasource.Type, "panel %s", p.Title)
		require.NotEmpty(t, p.Targets, "panel %s has no query", p.Title)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %s %s", p.Title, tg.RefID)
			require.False(t, refs[tg.RefID], "panel %s: refId %s twice", p.Title, tg.RefID)
			refs[tg.RefID] = true
			// Every query aggregates, so its series carry only its
			// grouping labels: a legend can show no other.
			require.Regexp(t, aggregated, tg.Expr, "panel %s %s", p.Title, tg.RefID)
			var keeps []string
			for _, grp := range grouping.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(grp[1], ",") {
					keeps = append(keeps, strings.TrimSpace(l))
				}
			}
			for _, m := range legendLabel.FindAllStringSubmatch(tg.Legend, -1) {
				require.Contains(t, keeps, m[1], "panel %s %s: legend shows {{%s}}, which the query drops", p.Title, tg.RefID, m[1])
			}
			require.NotNil(t, tg.Datasource, "panel %s %s", p.Title, tg.RefID)
			require.Equal(t, dsVar, tg.Datasource.UID, "panel %s %s", p.Title, tg.RefID)
			for _, m := range variableRef.FindAllStringSubmatch(tg.Expr, -1) {
				if m[1] == "__rate_interval" || m[1] == "__interval" || m[1] == "__range" {
					continue
				}
				require.True(t, defined[m[1]], "panel %s uses undefined variable $%s", p.Title, m[1])
				used[m[1]] = true
			}
		}
		require.True(t, p.GridPos.W > 0 && p.GridPos.H > 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %s gridPos %+v", p.Title, p.GridPos)
	}
	for name := range defined {
		require.True(t, used[name], "variable %s is used by no panel", name)
	}
	for i, a := range boxes {
		for _, b := range boxes[i+1:] {
			overlap := a.GridPos.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < a.GridPos.X+a.GridPos.W &&
				a.GridPos.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < a.GridPos.Y+a.GridPos.H
			require.False(t, overlap, "panels %q and %q overlap", a.Title, b.Title)
		}
	}
	require.True(t, slices.ContainsFunc(boxes, func(p panel) bool { return p.Type == "state-timeline" }), "no breaker state timeline")
}

// TestCheckExprCatchesMistakes: the expression check the dashboard and
// rule tests rest on rejects an unknown metric, a label the metric lacks,
// an unknown error class and a grouping label no metric has, and accepts
// a histogram's series.
func TestCheckExprCatchesMistakes(t *testing.T) {
	t.Parallel()
	exp := exported(t)
	for expr, want := range map[string]int{
		`rate(jsbridge_bridge_events_forwarded[5m])`:                                                   1,
		`jsbridge_consumer_in_flight{endpoint="x"}`:                                                    1,
		`rate(jsbridge_bridge_publish_errors_total{class=~"timeout|dns"}[5m])`:                         1,
		`sum by (subscription) (rate(jsbridge_bridge_publishes_total[5m]))`:                            1,
		`jsbridge_bridge_streams_blocked_count`:                                                        1,
		`histogram_quantile(0.9, sum by (le) (rate(jsbridge_bridge_ack_duration_seconds_bucket[5m])))`: 0,
		`sum by (instance, status) (rate(jsbridge_bridge_publishes_total{job="b"}[5m]))`:               0,
	} {
		_, problems := checkExpr(expr, exp)
		require.Len(t, problems, want, "%s: %v", expr, problems)
	}
}
