// Package bridgemetrics is the bridge's Prometheus metrics: it implements
// drain.Observer and forward.Observer (counters and latency histograms of
// what this process does) and collects, at every scrape, the backlog gauges
// from Postgres, so blocked and lagging streams read the same on every
// bridge replica and start at 0.
package bridgemetrics

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/drain"
	"github.com/jsbridge/jsbridge/forward"
	"github.com/jsbridge/jsbridge/store"
)

// BacklogFunc reads the backlog over all streams (store.Store.Backlog).
type BacklogFunc func(ctx context.Context) (store.Backlog, error)

// backlogTimeout bounds the Postgres query behind one scrape.
const backlogTimeout = 5 * time.Second

// Metrics holds the bridge's collectors. Its methods are safe for
// concurrent use and never block.
type Metrics struct {
	forwarded   prometheus.Counter
	duplicates  prometheus.Counter
	publishes   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	settled     *prometheus.CounterVec
	claimed     prometheus.Counter
	claimErrors prometheus.Counter
	claimDur    prometheus.Histogram
	publishDur  prometheus.Histogram
	ackDur      prometheus.Histogram
	unavailable *prometheus.GaugeVec

	// The children of publishes by Status and of settled by how, taken
	// once: a label look-up (hashing, a read lock) per event otherwise.
	byStatus [forward.AlreadyStored + 1]prometheus.Counter
	byHow    map[string]prometheus.Counter
}

// settledHows are the values of Settled's how (drain.Settled*).
var settledHows = []string{drain.SettledAcked, drain.SettledRetried, drain.SettledBlocked,
	drain.SettledReleased, drain.SettledLeaseLost, drain.SettledError}

var (
	_ drain.Observer   = (*Metrics)(nil)
	_ forward.Observer = (*Metrics)(nil)
)

// New registers the bridge's metrics on reg, with the backlog gauges read
// through backlog at every scrape (a failed read leaves them out of that
// scrape and is logged to log, which may be nil for slog.Default()).
// Errors: reg or backlog nil, or a name already registered.
func New(reg prometheus.Registerer, backlog BacklogFunc, log *slog.Logger) (*Metrics, error) {
	if reg == nil || backlog == nil {
		return nil, errors.New("bridgemetrics: registerer and backlog func are required")
	}
	if log == nil {
		log = slog.Default()
	}
	latency := prometheus.ExponentialBuckets(0.0005, 2, 14) // 0.5ms .. ~4s
	m := &Metrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jsbridge_bridge_events_forwarded_total",
			Help: "Events forwarded to JetStream whose stream's watermark this bridge advanced past them (stored or reported duplicate).",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jsbridge_bridge_duplicates_total",
			Help: "Publishes JetStream reported as duplicates (same Nats-Msg-Id inside the duplicate window) and dropped.",
		}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_bridge_publishes_total",
			Help: "Publish attempts by status: stored, duplicate or failed.",
		}, []string{"status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_bridge_publish_errors_total",
			Help: "Failed publishes by class: too_large and invalid_data (non-retryable, the stream blocks), timeout (also cut by the cycle's deadline), canceled (cut by shutdown), no_responders, connection, storage (JetStream unavailable, or refusing for lack of storage: the stream backs off, counts no retry, never blocks), conflict, not_attempted (after an earlier failure in the stream), other.",
		}, []string{"class"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_bridge_streams_settled_total",
			Help: "Claimed streams settled, by how: acked, retried, blocked, released, lease_lost, error.",
		}, []string{"how"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jsbridge_bridge_streams_claimed_total",
			Help: "Streams this bridge claimed under lease.",
		}),
		claimErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jsbridge_bridge_claim_errors_total",
			Help: "Claims that failed (Postgres unreachable or erroring).",
		}),
		claimDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jsbridge_bridge_claim_duration_seconds", Buckets: latency,
			Help: "Duration of one claim statement.",
		}),
		publishDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jsbridge_bridge_publish_duration_seconds", Buckets: latency,
			Help: "Time from sending one event to JetStream to its PubAck or error.",
		}),
		ackDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jsbridge_bridge_ack_duration_seconds", Buckets: latency,
			Help: "Duration of the Postgres call that acked a stream (advanced its watermark), observed once per acked stream: the streams of a cycle are acked by one statement, and each observes its duration.",
		}),
	}
	m.unavailable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "jsbridge_bus_unavailable",
		Help: "1 while JetStream refuses this process's writes for the reason (storage: lack of storage, from the first refusal until a write is stored again), else 0. The drain waits meanwhile: no retry counted, no stream blocked.",
	}, []string{"reason"})
	m.unavailable.WithLabelValues("storage").Set(0)
	for st := range m.byStatus {
		m.byStatus[st] = m.publishes.WithLabelValues(forward.Status(st).String())
	}
	m.byHow = make(map[string]prometheus.Counter, len(settledHows))
	for _, how := range settledHows {
		m.byHow[how] = m.settled.WithLabelValues(how)
	}
	bc := &backlogCollector{
		read: backlog,
		log:  log,
		blocked: prometheus.NewDesc("jsbridge_bridge_streams_blocked",
			"Blocked streams (all replicas: read from Postgres at scrape).", nil, nil),
		lagging: prometheus.NewDesc("jsbridge_bridge_streams_lagging",
			"Streams, not blocked, with events past their watermark (read from Postgres at scrape).", nil, nil),
		oldest: prometheus.NewDesc("jsbridge_bridge_oldest_unforwarded_event_age_seconds",
			"Age of the oldest event not yet forwarded, blocked streams included; 0 when none (read from Postgres at scrape).", nil, nil),
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.duplicates, m.publishes, m.errors, m.settled,
		m.claimed, m.claimErrors, m.claimDur, m.publishDur, m.ackDur, m.unavailable, bc} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Claimed implements drain.Observer.
func (m *Metrics) Claimed(streams int, took time.Duration, err error) {
	m.claimDur.Observe(took.Seconds())
	if err != nil {
		m.claimErrors.Inc()
		return
	}
	m.claimed.Add(float64(streams))
}

// Settled implements drain.Observer.
func (m *Metrics) Settled(_, how string, forwarded int, took time.Duration) {
	if c, ok := m.byHow[how]; ok {
		c.Inc()
	} else {
		m.settled.WithLabelValues(how).Inc()
	}
	m.forwarded.Add(float64(forwarded))
	if how == drain.SettledAcked {
		m.ackDur.Observe(took.Seconds())
	}
}

// BusUnavailable sets jsbridge_bus_unavailable{reason} to 1 (on) or 0.
func (m *Metrics) BusUnavailable(reason string, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.unavailable.WithLabelValues(reason).Set(v)
}

// Published implements forward.Observer.
func (m *Metrics) Published(o forward.Outcome, took time.Duration) {
	m.publishDur.Observe(took.Seconds())
	if o.Status >= 0 && int(o.Status) < len(m.byStatus) {
		m.byStatus[o.Status].Inc()
	} else {
		m.publishes.WithLabelValues(o.Status.String()).Inc()
	}
	switch o.Status {
	case forward.Duplicate:
		m.duplicates.Inc()
	case forward.Failed:
		m.errors.WithLabelValues(forward.ErrorClass(o.Err)).Inc()
	}
}

type backlogCollector struct {
	read                     BacklogFunc
	log                      *slog.Logger
	blocked, lagging, oldest *prometheus.Desc
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocked
	ch <- c.lagging
	ch <- c.oldest
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	b, err := c.read(ctx)
	if err != nil {
		c.log.Warn("metrics: read the stream backlog from Postgres", "error", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, float64(b.Blocked))
	ch <- prometheus.MustNewConstMetric(c.lagging, prometheus.GaugeValue, float64(b.Lagging))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, b.OldestAge.Seconds())
}
