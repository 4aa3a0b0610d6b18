package deliver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/promreg"
)

// metrics are the consumer's Prometheus collectors.
type metrics struct {
	deliveries *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   *prometheus.GaugeVec

	redeliveries *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	replayed     *prometheus.CounterVec

	// Ordered subscriptions only.
	partitionsOwned *prometheus.GaugeVec
	streamsParked   *prometheus.GaugeVec
	orderStuck      *prometheus.GaugeVec
	streamsAside    *prometheus.GaugeVec
	asideStuck      *prometheus.GaugeVec
	oldestHeld      *prometheus.GaugeVec
	fenceWaiting    *prometheus.GaugeVec
	handovers       *prometheus.CounterVec
	fenceResets     *prometheus.CounterVec
	copyLagMsgs     *prometheus.GaugeVec
	copyLagSeconds  *prometheus.GaugeVec
}

func newDeliveries() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_deliveries_total",
		Help: "Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).",
	}, []string{"subscription", "outcome", "status_class"})
}

// DeliveriesCounter returns jsbridge_consumer_deliveries_total
// (subscription, outcome, status_class) registered on reg, or the one
// registered there already (nil reg: unregistered): the shared engine
// counts its attempts in the same series as this engine.
func DeliveriesCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := newDeliveries()
	if reg == nil {
		return c, nil
	}
	return promreg.Register(reg, c)
}

func newDeadLetters() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_dead_letters_total",
		Help: "Deliveries given up on and written to the dead-letter stream, by subscription.",
	}, []string{"subscription"})
}

// DeadLettersCounter returns jsbridge_consumer_dead_letters_total
// (subscription) registered on reg, or the one registered there already
// (nil reg: unregistered), for the shared engine.
func DeadLettersCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := newDeadLetters()
	if reg == nil {
		return c, nil
	}
	return promreg.Register(reg, c)
}

func newReplayed() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_dead_letters_replayed_total",
		Help: "Dead letters replayed to their endpoint (2xx) and removed from the dead-letter stream, by subscription.",
	}, []string{"subscription"})
}

// ReplayedCounter returns jsbridge_consumer_dead_letters_replayed_total
// (subscription) registered on reg, or the one registered there already
// (nil reg: unregistered), for the shared engine's replays.
func ReplayedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := newReplayed()
	if reg == nil {
		return c, nil
	}
	return promreg.Register(reg, c)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		deliveries: newDeliveries(),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "jsbridge_consumer_attempt_duration_seconds",
			Help:    "Duration of webhook POSTs in seconds, by subscription.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10),
		}, []string{"subscription"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_in_flight",
			Help: "Webhook deliveries in progress, by subscription.",
		}, []string{"subscription"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_redeliveries_total",
			Help: "Messages handled that JetStream had delivered before (a retry, or a redelivery after AckWait), by subscription.",
		}, []string{"subscription"}),
		deadLetters: newDeadLetters(),
		replayed:    newReplayed(),
		partitionsOwned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_partitions_owned",
			Help: "Partitions of an ordered subscription this replica holds the lease of, by subscription.",
		}, []string{"subscription"}),
		streamsParked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_streams_parked",
			Help: "Streams of an ordered subscription parked behind a dead-lettered event (all replicas' view), by subscription.",
		}, []string{"subscription"}),
		orderStuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_streams_order_stuck",
			Help: "Parked streams of an ordered subscription in the order-stuck state: the receiver's order gate refused their head (gap, in-progress) for longer than --order-stuck-after (all replicas' view), by subscription.",
		}, []string{"subscription"}),
		streamsAside: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_streams_set_aside",
			Help: "Streams of an ordered subscription this replica holds set aside: their head refused (or the stream parked), their later events acked out and read again from the partitioned copy once it goes, by subscription.",
		}, []string{"subscription"}),
		asideStuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_streams_set_aside_stuck",
			Help: "Streams of an ordered subscription this replica holds set aside for longer than --order-stuck-after, their head still refused in place (not parked), by subscription.",
		}, []string{"subscription"}),
		fenceWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_partition_fence_waiting_seconds",
			Help: "Seconds a partition of an ordered subscription this replica owns has waited behind its fence for the events pending on its consumer to be in hand (0: not waiting), by subscription and partition.",
		}, []string{"subscription", "partition"}),
		oldestHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_oldest_held_seconds",
			Help: "Age in seconds of the oldest event this replica holds behind a parked head (0: none), by subscription.",
		}, []string{"subscription"}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_handovers_total",
			Help: "Partitions of an ordered subscription this replica took over (acquired a lease), by subscription.",
		}, []string{"subscription"}),
		fenceResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jsbridge_consumer_partition_fence_resets_total",
			Help: "Times a partition of an ordered subscription on this replica reset its partition consumer to the ack floor because its fence waited for events nobody brings back or a stream waited for an event not pending on the consumer, by subscription.",
		}, []string{"subscription"}),
		copyLagMsgs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_ordered_copy_lag_messages",
			Help: "Messages of the events stream not yet sourced into its partitioned copy (0: caught up), by copy stream.",
		}, []string{"stream"}),
		copyLagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jsbridge_consumer_ordered_copy_lag_seconds",
			Help: "Age in seconds of the oldest events stream message not yet sourced into its partitioned copy (0: caught up), by copy stream.",
		}, []string{"stream"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.deliveries, err = promreg.Register(reg, m.deliveries); err != nil {
		return nil, err
	}
	if m.duration, err = promreg.Register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.inFlight, err = promreg.Register(reg, m.inFlight); err != nil {
		return nil, err
	}
	if m.redeliveries, err = promreg.Register(reg, m.redeliveries); err != nil {
		return nil, err
	}
	if m.deadLetters, err = promreg.Register(reg, m.deadLetters); err != nil {
		return nil, err
	}
	if m.replayed, err = promreg.Register(reg, m.replayed); err != nil {
		return nil, err
	}
	if m.partitionsOwned, err = promreg.Register(reg, m.partitionsOwned); err != nil {
		return nil, err
	}
	if m.streamsParked, err = promreg.Register(reg, m.streamsParked); err != nil {
		return nil, err
	}
	if m.orderStuck, err = promreg.Register(reg, m.orderStuck); err != nil {
		return nil, err
	}
	if m.streamsAside, err = promreg.Register(reg, m.streamsAside); err != nil {
		return nil, err
	}
	if m.asideStuck, err = promreg.Register(reg, m.asideStuck); err != nil {
		return nil, err
	}
	if m.oldestHeld, err = promreg.Register(reg, m.oldestHeld); err != nil {
		return nil, err
	}
	if m.fenceWaiting, err = promreg.Register(reg, m.fenceWaiting); err != nil {
		return nil, err
	}
	if m.handovers, err = promreg.Register(reg, m.handovers); err != nil {
		return nil, err
	}
	if m.fenceResets, err = promreg.Register(reg, m.fenceResets); err != nil {
		return nil, err
	}
	if m.copyLagMsgs, err = promreg.Register(reg, m.copyLagMsgs); err != nil {
		return nil, err
	}
	if m.copyLagSeconds, err = promreg.Register(reg, m.copyLagSeconds); err != nil {
		return nil, err
	}
	return m, nil
}
