package deliver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/promreg"
)

func newDeliveries() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jsbridge_consumer_deliveries_total",
		Help: "Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).",
	}, []string{"subscription", "outcome", "status_class"})
}

// DeliveriesCounter returns jsbridge_consumer_deliveries_total
// (subscription, outcome, status_class) registered on reg, or the one
// registered there already (nil reg: unregistered).
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
// (nil reg: unregistered).
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
// (nil reg: unregistered).
func ReplayedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := newReplayed()
	if reg == nil {
		return c, nil
	}
	return promreg.Register(reg, c)
}
