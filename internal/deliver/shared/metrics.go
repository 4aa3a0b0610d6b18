package shared

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/promreg"
)

// Hand-over causes: the cause label of
// jsbridge_consumer_shared_handovers_total.
const (
	causeClaimed    = "claimed"     // gained: the share gave it to this replica
	causeRebalance  = "rebalance"   // released: the share moved it to another replica
	causeStopping   = "stopping"    // released: this replica stops
	causeLeaseLost  = "lease_lost"  // released: the lease was found taken or passed its deadline, or a receiver named a later epoch
	causeRecordLost = "record_lost" // released: a commit found the record claimed by another owner
	causeClaimError = "claim_error" // released: the record could not be claimed
)

// metrics are the replica's own collectors (docs/observability.md,
// "The shared engine"). The deliveries counter is Deps.Deliveries.
type metrics struct {
	handovers *prometheus.CounterVec
	commits   *prometheus.CounterVec
}

// newMetrics makes the replica's metrics and registers them on reg (nil:
// unregistered). The owned partitions and the cursors are read from r
// when scraped.
func newMetrics(reg prometheus.Registerer, r *Replica) (*metrics, error) {
	m := &metrics{
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_shared_handovers_total",
			Help: "Partitions this replica gained or released (direction), by cause: claimed; rebalance, stopping, lease_lost, record_lost, claim_error.",
		}, []string{"direction", "cause"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_position_commits_total",
			Help: "Writes of the positions bucket by this replica: key record (pos.p<N>, the claim's and every commit) or cursor (cur.<subscription>.p<N>), result ok or failed (a compare-and-set refused, or the server's error).",
		}, []string{"key", "result"}),
	}
	owned := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_shared_partitions_owned",
		Help: "Partitions this replica holds the lease of (the shared engine).",
	}, func() float64 { return float64(len(r.Owned())) })
	if reg == nil {
		return m, nil
	}
	// Two replicas on one registry share the counters; the gauges read
	// the first one.
	var err error
	if m.handovers, err = promreg.Register(reg, m.handovers); err != nil {
		return nil, err
	}
	if m.commits, err = promreg.Register(reg, m.commits); err != nil {
		return nil, err
	}
	if _, err = promreg.Register(reg, owned); err != nil {
		return nil, err
	}
	if _, err = promreg.Register(reg, prometheus.Collector(cursorCollector{r: r})); err != nil {
		return nil, err
	}
	return m, nil
}

// handover counts one partition gained or released.
func (m *metrics) handover(gained bool, cause string) {
	dir := "released"
	if gained {
		dir = "gained"
	}
	m.handovers.WithLabelValues(dir, cause).Inc()
}

// releaseCause names why a claim whose context ended (ctx) was given
// up; recordLost when a commit found the record another owner's.
func releaseCause(ctx context.Context, recordLost bool) string {
	cause := context.Cause(ctx)
	switch {
	case recordLost:
		return causeRecordLost
	case errors.Is(cause, owner.ErrReleased):
		return causeRebalance
	case errors.Is(cause, owner.ErrStopping):
		return causeStopping
	default:
		return causeLeaseLost
	}
}

// cursorsDesc is jsbridge_consumer_cursors.
var cursorsDesc = prometheus.NewDesc("jsbridge_consumer_cursors",
	"Subscriptions with a cursor on the partitions this replica serves, by state (behind, breaker, paused, disabled, held): one per subscription and partition.",
	[]string{"state"}, nil)

// cursorCollector reads the cursors of the replica's partitions when
// scraped.
type cursorCollector struct{ r *Replica }

func (c cursorCollector) Describe(ch chan<- *prometheus.Desc) { ch <- cursorsDesc }

func (c cursorCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, st := range c.r.Status() {
		for _, state := range st.Behind {
			n[state]++
		}
	}
	for _, state := range []string{"behind", "breaker", "paused", "disabled", "held"} {
		ch <- prometheus.MustNewConstMetric(cursorsDesc, prometheus.GaugeValue, float64(n[state]), state)
		delete(n, state)
	}
	for state, v := range n {
		ch <- prometheus.MustNewConstMetric(cursorsDesc, prometheus.GaugeValue, float64(v), state)
	}
}

// recordPrefix starts every record key (position.Key).
var recordPrefix = strings.TrimSuffix(position.Key(0), "0")

// membersPrefix starts every members key (position.MembersKey).
var membersPrefix = strings.SplitAfter(position.MembersKey(0, "", 0), ".")[0]

// countingKV is the positions bucket as the records' commits use it:
// every Create and Update of a record or cursor key, and every Put of a
// members key, is counted in jsbridge_consumer_position_commits_total.
type countingKV struct {
	jetstream.KeyValue
	m *metrics
}

func (kv countingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, value, opts...)
	kv.count(key, err)
	return rev, err
}

func (kv countingKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, revision)
	kv.count(key, err)
	return rev, err
}

func (kv countingKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := kv.KeyValue.Put(ctx, key, value)
	kv.count(key, err)
	return rev, err
}

func (kv countingKV) count(key string, err error) {
	kind := "cursor"
	switch {
	case strings.HasPrefix(key, recordPrefix):
		kind = "record"
	case strings.HasPrefix(key, membersPrefix):
		kind = "members"
	}
	result := "ok"
	if err != nil {
		result = "failed"
	}
	kv.m.commits.WithLabelValues(kind, result).Inc()
}
