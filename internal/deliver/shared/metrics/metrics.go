// Package metrics is one shared-engine replica's own collectors
// (docs/observability.md, "The shared engine"): the partitions gained
// and released by cause (jsbridge_consumer_shared_handovers_total), the
// positions bucket's writes (jsbridge_consumer_position_commits_total,
// counted by the bucket KV wraps), the partitions owned and the cursors
// by state and the streams parked or set aside, read from the replica
// (Sources) when scraped. The
// deliveries counter is the replica's Deps.Deliveries, not here.
package metrics

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/throttle"
	"github.com/jsbridge/jsbridge/internal/promreg"
)

// Hand-over causes: the cause label of
// jsbridge_consumer_shared_handovers_total.
const (
	// CauseClaimed: gained, the share gave it to this replica.
	CauseClaimed = "claimed"
	// CauseRebalance: released, the share moved it to another replica.
	CauseRebalance = "rebalance"
	// CauseStopping: released, this replica stops.
	CauseStopping = "stopping"
	// CauseLeaseLost: released, the lease was found taken or passed its
	// deadline, or a receiver named a later epoch.
	CauseLeaseLost = "lease_lost"
	// CauseRecordLost: released, a commit found the record claimed by
	// another owner.
	CauseRecordLost = "record_lost"
	// CauseClaimError: released, the record could not be claimed.
	CauseClaimError = "claim_error"
)

// Sources are what the gauges read from the replica when scraped.
type Sources struct {
	// Owned returns how many partitions the replica holds the lease of.
	Owned func() int
	// Cursors returns, for each partition the replica serves, the
	// subscriptions with a cursor there and its state.
	Cursors func() []map[string]string
	// Asides returns the replica's subscriptions (each reported, 0 when
	// none of its streams is aside) and the streams set aside on the
	// partitions the replica serves (their records' asides).
	Asides func() ([]string, []position.Aside)
	// AsideAges returns, for each of the replica's subscriptions, the
	// age in seconds of the oldest event a parked or set-aside stream
	// of it holds back (0: none; +Inf: that event is no longer in the
	// events stream), and the events stream's MaxAge in seconds (0:
	// none); ok false when the events stream could not be read (the
	// scrape then has neither gauge). nil: neither gauge.
	AsideAges func() (ages map[string]float64, maxAge float64, ok bool)
	// InFlight returns, by subscription, the POSTs under way on the
	// replica (the MaxInFlight slots taken).
	InFlight func() map[string]int
}

// Metrics are the replica's own counters. The zero value is not usable:
// make one with New.
type Metrics struct {
	handovers *prometheus.CounterVec
	commits   *prometheus.CounterVec
	// duration and rate are each subscription's sender's (Attempt).
	duration *prometheus.HistogramVec
	rate     *prometheus.GaugeVec
}

// New makes the replica's metrics and registers them on reg (nil:
// unregistered). The owned partitions and the cursors are read from src
// when scraped. Two replicas on one registry share the counters; the
// gauges read the first one. Errors: reg's, for a collector of the same
// name but another shape.
func New(reg prometheus.Registerer, src Sources) (*Metrics, error) {
	m := &Metrics{
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_shared_handovers_total",
			Help: "Partitions this replica gained or released (direction), by cause: claimed; rebalance, stopping, lease_lost, record_lost, claim_error.",
		}, []string{"direction", "cause"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_position_commits_total",
			Help: "Writes of the positions bucket by this replica: key record (pos.p<N>, the claim's and every commit) or cursor (cur.<subscription>.p<N>), result ok or failed (a compare-and-set refused, or the server's error).",
		}, []string{"key", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "jsbridge_consumer_attempt_duration_seconds",
			Help:    "Duration of webhook POSTs in seconds, by subscription.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10),
		}, []string{"subscription"}),
	}
	var err error
	if m.rate, err = throttle.NewRateGauge(nil); err != nil {
		return nil, err
	}
	owned := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jsbridge_consumer_shared_partitions_owned",
		Help: "Partitions this replica holds the lease of (the shared engine).",
	}, func() float64 { return float64(src.Owned()) })
	if reg == nil {
		return m, nil
	}
	if m.handovers, err = promreg.Register(reg, m.handovers); err != nil {
		return nil, err
	}
	if m.commits, err = promreg.Register(reg, m.commits); err != nil {
		return nil, err
	}
	if m.duration, err = promreg.Register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.rate, err = promreg.Register(reg, m.rate); err != nil {
		return nil, err
	}
	if _, err = promreg.Register(reg, owned); err != nil {
		return nil, err
	}
	if _, err = promreg.Register(reg, prometheus.Collector(cursorCollector{cursors: src.Cursors})); err != nil {
		return nil, err
	}
	if src.InFlight != nil {
		if _, err = promreg.Register(reg, prometheus.Collector(inFlightCollector{inFlight: src.InFlight})); err != nil {
			return nil, err
		}
	}
	if src.Asides != nil {
		if _, err = promreg.Register(reg, prometheus.Collector(asideCollector{asides: src.Asides})); err != nil {
			return nil, err
		}
	}
	if src.AsideAges != nil {
		if _, err = promreg.Register(reg, prometheus.Collector(asideAgeCollector{ages: src.AsideAges})); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Attempt returns the metrics of subscription sub's sender: deliveries
// (jsbridge_consumer_deliveries_total), its child of
// jsbridge_consumer_attempt_duration_seconds (each POST's duration) and
// of jsbridge_consumer_rate_limit (the requests per second its POSTs are
// held to on this replica, 0: no limit).
func (m *Metrics) Attempt(sub string, deliveries *prometheus.CounterVec) attempt.Metrics {
	return attempt.Metrics{Deliveries: deliveries, Duration: m.duration.WithLabelValues(sub), Rate: m.rate.WithLabelValues(sub)}
}

// Handover counts one partition gained or released, for cause (a
// Cause* value).
func (m *Metrics) Handover(gained bool, cause string) {
	dir := "released"
	if gained {
		dir = "gained"
	}
	m.handovers.WithLabelValues(dir, cause).Inc()
}

// ReleaseCause names why a claim whose context ended (ctx, its cause
// owner.ErrReleased, owner.ErrStopping or another) was given up;
// recordLost when a commit found the record another owner's.
func ReleaseCause(ctx context.Context, recordLost bool) string {
	cause := context.Cause(ctx)
	switch {
	case recordLost:
		return CauseRecordLost
	case errors.Is(cause, owner.ErrReleased):
		return CauseRebalance
	case errors.Is(cause, owner.ErrStopping):
		return CauseStopping
	default:
		return CauseLeaseLost
	}
}

// cursorsDesc is jsbridge_consumer_cursors.
var cursorsDesc = prometheus.NewDesc("jsbridge_consumer_cursors",
	"Subscriptions with a cursor on the partitions this replica serves, by state (behind, breaker, paused, disabled, held): one per subscription and partition.",
	[]string{"state"}, nil)

// cursorCollector reads the cursors of the replica's partitions when
// scraped.
type cursorCollector struct{ cursors func() []map[string]string }

func (c cursorCollector) Describe(ch chan<- *prometheus.Desc) { ch <- cursorsDesc }

func (c cursorCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, behind := range c.cursors() {
		for _, state := range behind {
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

// The streams gauges, by subscription, over the partitions this replica
// serves (summed over the replicas, every partition's).
var (
	parkedDesc = prometheus.NewDesc("jsbridge_consumer_streams_parked",
		"Ordered subscriptions: streams parked behind a dead-lettered event (on_dead_letter: park, or order-stuck), on the partitions this replica serves.",
		[]string{"subscription"}, nil)
	setAsideDesc = prometheus.NewDesc("jsbridge_consumer_streams_set_aside",
		"Ordered subscriptions: streams set aside as stuck (their head retried in place while the shared read passes their later events), on the partitions this replica serves.",
		[]string{"subscription"}, nil)
)

// asideCollector reads the records' asides of the replica's partitions
// when scraped.
type asideCollector struct {
	asides func() ([]string, []position.Aside)
}

func (c asideCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- parkedDesc
	ch <- setAsideDesc
}

func (c asideCollector) Collect(ch chan<- prometheus.Metric) {
	type counts struct{ parked, setAside int }
	by := map[string]*counts{}
	subs, asides := c.asides()
	for _, sub := range subs {
		by[sub] = &counts{}
	}
	for _, a := range asides {
		n := by[a.Sub]
		if n == nil {
			n = &counts{}
			by[a.Sub] = n
		}
		switch a.State {
		case fanout.AsideParked:
			n.parked++
		case fanout.AsideStuck:
			n.setAside++
		}
	}
	for sub, n := range by {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(n.parked), sub)
		ch <- prometheus.MustNewConstMetric(setAsideDesc, prometheus.GaugeValue, float64(n.setAside), sub)
	}
}

// The aside-age gauges: how close the streams set aside are to the
// events stream's MaxAge, past which their held-back events are removed
// (docs/retention.md).
var (
	asideAgeDesc = prometheus.NewDesc("jsbridge_consumer_streams_aside_oldest_age_seconds",
		"Ordered subscriptions: the age in seconds of the oldest event a parked or set-aside stream holds back, on the partitions this replica serves (0: none; +Inf: the event is no longer in the events stream).",
		[]string{"subscription"}, nil)
	maxAgeDesc = prometheus.NewDesc("jsbridge_consumer_events_max_age_seconds",
		"The events stream's MaxAge in seconds (0: none): a stream parked longer loses its held-back events.",
		nil, nil)
)

// asideAgeCollector reads the aside-age gauges when scraped.
type asideAgeCollector struct {
	ages func() (map[string]float64, float64, bool)
}

func (c asideAgeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- asideAgeDesc
	ch <- maxAgeDesc
}

func (c asideAgeCollector) Collect(ch chan<- prometheus.Metric) {
	ages, maxAge, ok := c.ages()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(maxAgeDesc, prometheus.GaugeValue, maxAge)
	for sub, age := range ages {
		ch <- prometheus.MustNewConstMetric(asideAgeDesc, prometheus.GaugeValue, age, sub)
	}
}

// inFlightDesc is jsbridge_consumer_in_flight.
var inFlightDesc = prometheus.NewDesc("jsbridge_consumer_in_flight",
	"Webhook deliveries in progress on this replica (the subscription's max_in_flight slots taken), by subscription.",
	[]string{"subscription"}, nil)

// inFlightCollector reads the senders' slots when scraped.
type inFlightCollector struct{ inFlight func() map[string]int }

func (c inFlightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- inFlightDesc }

func (c inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for sub, n := range c.inFlight() {
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(n), sub)
	}
}

// recordPrefix starts every record key (position.Key).
var recordPrefix = strings.TrimSuffix(position.Key(0), "0")

// membersPrefix starts every members key (position.MembersKey).
var membersPrefix = strings.SplitAfter(position.MembersKey(0, "", 0), ".")[0]

// KV returns the positions bucket kv as the records' commits use it:
// every Create and Update of a record or cursor key, and every Put of a
// members key, is counted in jsbridge_consumer_position_commits_total.
func (m *Metrics) KV(kv jetstream.KeyValue) jetstream.KeyValue {
	return countingKV{KeyValue: kv, m: m}
}

// countingKV is KV's bucket.
type countingKV struct {
	jetstream.KeyValue
	m *Metrics
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
