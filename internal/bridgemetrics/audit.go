package bridgemetrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AuditRound is what one completed round of `bridge verify --continuous`
// found, in plain numbers (the audit package's Report, reduced).
type AuditRound struct {
	// Events is how many Postgres events were checked.
	Events int64
	// Missing, Duplicates, OutOfOrder and ContentDiffers are the problems
	// left at the end of the round, by kind (a missing event that --repair
	// re-published is not counted).
	Missing, Duplicates, OutOfOrder, ContentDiffers int
	// Repaired is how many missing events --repair re-published.
	Repaired int
	// Duration is how long the round took; End is when it ended.
	Duration time.Duration
	End      time.Time
}

// Audit holds the metrics of `bridge verify --continuous`. Its methods are
// safe for concurrent use and never block.
type Audit struct {
	missing, duplicates, outOfOrder, differs prometheus.Gauge
	checked, repaired                        prometheus.Counter
	rounds                                   *prometheus.CounterVec
	lastEnd, lastDuration                    prometheus.Gauge
}

// Results of an audit round, the values of jsbridge_bridge_audit_rounds_total's
// result label.
const (
	// AuditClean: the round found nothing wrong (or repaired all it found).
	AuditClean = "clean"
	// AuditProblems: the round left problems.
	AuditProblems = "problems"
	// AuditFailed: the round could not be completed (Postgres or NATS
	// unavailable, the JetStream stream missing); the gauges keep the last
	// completed round's values.
	AuditFailed = "failed"
)

// NewAudit registers the audit metrics on reg. The problem gauges start at
// 0 and the last-run gauges at 0 (no round completed yet). Errors: reg nil,
// or a name already registered.
func NewAudit(reg prometheus.Registerer) (*Audit, error) {
	if reg == nil {
		return nil, errors.New("bridgemetrics: registerer is required")
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	a := &Audit{
		missing: gauge("jsbridge_bridge_audit_missing",
			"Forwarded events JetStream does not hold, as the last completed verify round left them (after --repair)."),
		duplicates: gauge("jsbridge_bridge_audit_duplicates",
			"Extra copies of events JetStream stores, found by the last completed verify round."),
		outOfOrder: gauge("jsbridge_bridge_audit_out_of_order",
			"Events JetStream stores after a later version of their stream, found by the last completed verify round."),
		differs: gauge("jsbridge_bridge_audit_content_differs",
			"Events whose stored message differs from what Postgres holds (data, subject or headers), found by the last completed verify round."),
		checked: prometheus.NewCounter(prometheus.CounterOpts{Name: "jsbridge_bridge_audit_events_checked_total",
			Help: "Postgres events compared with JetStream by completed verify rounds."}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{Name: "jsbridge_bridge_audit_repaired_total",
			Help: "Missing events verify --repair re-published."}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jsbridge_bridge_audit_rounds_total",
			Help: "Verify rounds by result: clean, problems, failed (not completed)."}, []string{"result"}),
		lastEnd: gauge("jsbridge_bridge_audit_last_run_timestamp_seconds",
			"Unix time the last completed verify round ended (0: none yet)."),
		lastDuration: gauge("jsbridge_bridge_audit_last_run_duration_seconds",
			"Duration of the last completed verify round."),
	}
	for _, r := range []string{AuditClean, AuditProblems, AuditFailed} {
		a.rounds.WithLabelValues(r) // every result reads 0 before it happens
	}
	for _, c := range []prometheus.Collector{a.missing, a.duplicates, a.outOfOrder, a.differs, a.checked, a.repaired,
		a.rounds, a.lastEnd, a.lastDuration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Completed records a round that read both sides to the end.
func (a *Audit) Completed(r AuditRound) {
	a.missing.Set(float64(r.Missing))
	a.duplicates.Set(float64(r.Duplicates))
	a.outOfOrder.Set(float64(r.OutOfOrder))
	a.differs.Set(float64(r.ContentDiffers))
	a.checked.Add(float64(r.Events))
	a.repaired.Add(float64(r.Repaired))
	a.lastEnd.Set(float64(r.End.UnixNano()) / 1e9)
	a.lastDuration.Set(r.Duration.Seconds())
	result := AuditClean
	if r.Missing+r.Duplicates+r.OutOfOrder+r.ContentDiffers > 0 {
		result = AuditProblems
	}
	a.rounds.WithLabelValues(result).Inc()
}

// Failed records a round that could not be completed; the gauges keep the
// last completed round's values (the last-run timestamp ages, which is
// what an alert on a stale audit watches).
func (a *Audit) Failed() { a.rounds.WithLabelValues(AuditFailed).Inc() }
