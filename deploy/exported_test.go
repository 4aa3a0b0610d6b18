package deploy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/bridgemetrics"
	"github.com/jsbridge/jsbridge/jsbridgetest"
	"github.com/jsbridge/jsbridge/store"
)

// metric is one exported metric family: its type and label names.
type metric struct {
	typ    dto.MetricType
	labels []string
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// capture is a registry that remembers the collectors registered on it, so
// that the test can create one child of every vector: a vector without
// children is not gathered.
type capture struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (c *capture) Register(col prometheus.Collector) error {
	if err := c.Registry.Register(col); err != nil {
		return err
	}
	c.collectors = append(c.collectors, col)
	return nil
}

func (c *capture) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// child creates one child of a vector through get, trying label counts
// until the vector accepts one (a wrong count is an error, not a panic).
func child[M any](t *testing.T, get func(...string) (M, error)) {
	t.Helper()
	for n := 0; n <= 10; n++ {
		if _, err := get(slices.Repeat([]string{"x"}, n)...); err == nil {
			return
		}
	}
	t.Fatalf("no label count between 0 and 10 fits the vector")
}

// exported returns the jsbridge metrics the bridge and the consumer
// register, by name, as the binaries build them: the bridge's
// bridgemetrics.New and (verify --continuous) NewAudit, the consumer's
// consumer.New and Provision (delivery, breaker, attempts-record and
// engine metrics), all on one fresh registry.
func exported(t *testing.T) map[string]metric {
	t.Helper()
	reg := &capture{Registry: prometheus.NewRegistry()}
	noBacklog := func(context.Context) (store.Backlog, error) { return store.Backlog{}, nil }
	_, err := bridgemetrics.New(reg, noBacklog, nil)
	require.NoError(t, err)
	_, err = bridgemetrics.NewAudit(reg) // bridge verify --continuous
	require.NoError(t, err)
	_, js := jsbridgetest.Connect(t, jsbridgetest.StartJetStream(t, embedded.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The events stream as the bridge creates it, so that Provision
	// finds what it waits for and the engine's own metrics are there.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, AllowDirect: true})
	require.NoError(t, err)
	c, err := consumer.New(js, consumer.Config{Registerer: reg, Attempts: &consumer.AttemptsConfig{}, Subscriptions: []consumer.Subscription{{
		Name:           "orders",
		FilterSubjects: []string{"events.order.>"},
		URL:            "https://orders.example/webhooks",
		Secrets:        []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("deploy-test-secret-0123456789"))},
	}}}) // consumer run's metrics: deliveries, breakers, the attempts record, partitions, hand-overs, commits, cursors
	require.NoError(t, err)
	require.NoError(t, c.Provision(ctx))

	for _, col := range reg.collectors {
		switch v := col.(type) {
		case *prometheus.CounterVec:
			child(t, v.GetMetricWithLabelValues)
		case *prometheus.GaugeVec:
			child(t, v.GetMetricWithLabelValues)
		case *prometheus.HistogramVec:
			child(t, v.GetMetricWithLabelValues)
		case *prometheus.SummaryVec:
			child(t, v.GetMetricWithLabelValues)
		}
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := make(map[string]metric, len(mfs))
	for _, mf := range mfs {
		m := metric{typ: mf.GetType()}
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			m.labels = append(m.labels, lp.GetName())
		}
		out[mf.GetName()] = m
	}
	return out
}

// TestExportedMetricsAreGathered guards the helper the other tests rest on:
// it must see both binaries' metrics, vectors included, with their labels.
func TestExportedMetricsAreGathered(t *testing.T) {
	t.Parallel()
	got := exported(t)
	require.Equal(t, dto.MetricType_GAUGE, got["jsbridge_bridge_streams_blocked"].typ)
	require.Equal(t, []string{"class"}, got["jsbridge_bridge_publish_errors_total"].labels)
	require.Equal(t, dto.MetricType_COUNTER, got["jsbridge_consumer_position_commits_total"].typ)
	require.ElementsMatch(t, []string{"subscription", "outcome", "status_class"}, got["jsbridge_consumer_deliveries_total"].labels)
	require.Equal(t, []string{"endpoint"}, got["jsbridge_consumer_breaker_state"].labels)
	for name := range got {
		require.True(t, strings.HasPrefix(name, "jsbridge_bridge_") || strings.HasPrefix(name, "jsbridge_consumer_") || strings.HasPrefix(name, "jsbridge_bus_"), name)
	}
}

// readmeRow is one row of the README's metrics tables:
// | `name` | type | `label`, `label` | meaning |
var readmeRow = regexp.MustCompile("^\\| `(jsbridge_[a-z_]+)` \\| (counter|gauge|histogram|summary) \\|([^|]*)\\|")

// TestReadmeListsEveryMetric: docs/observability.md's "Metrics and health" tables name
// exactly the metrics the binaries export, with their types and labels.
func TestReadmeListsEveryMetric(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../docs/observability.md")
	require.NoError(t, err)
	defer f.Close()
	documented := map[string]metric{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := readmeRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				labels = append(labels, l)
			}
		}
		documented[m[1]] = metric{typ: dto.MetricType(dto.MetricType_value[strings.ToUpper(m[2])]), labels: labels}
	}
	require.NoError(t, sc.Err())
	got := exported(t)
	require.ElementsMatch(t, keys(got), keys(documented), "docs/observability.md metrics tables vs the registries")
	for name, m := range got {
		require.Equal(t, m.typ, documented[name].typ, "README type of %s", name)
		require.ElementsMatch(t, m.labels, documented[name].labels, "README labels of %s", name)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
