package deliver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/promreg"
)

// DeliveriesCounter returns jsbridge_consumer_deliveries_total
// (subscription, outcome, status_class) registered on reg, or the one
// registered there already (nil reg: unregistered).
func DeliveriesCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return counter(reg, "jsbridge_consumer_deliveries_total",
		"Webhook delivery attempts by subscription, outcome (ack, retry, term, exhausted, breaker_open) and status class (2xx..5xx, timeout, network, tls, forbidden, none).",
		"subscription", "outcome", "status_class")
}

// DeadLettersCounter returns jsbridge_consumer_dead_letters_total
// (subscription) registered on reg, or the one registered there already
// (nil reg: unregistered).
func DeadLettersCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return counter(reg, "jsbridge_consumer_dead_letters_total",
		"Deliveries given up on and written to the dead-letter stream, by subscription.", "subscription")
}

// ReplayedCounter returns jsbridge_consumer_dead_letters_replayed_total
// (subscription) registered on reg, or the one registered there already
// (nil reg: unregistered).
func ReplayedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return counter(reg, "jsbridge_consumer_dead_letters_replayed_total",
		"Dead letters replayed to their endpoint (2xx) and removed from the dead-letter stream, by subscription.", "subscription")
}

// counter returns the counter vector name with labels, registered on reg
// (promreg.Register: the one registered there already wins), or
// unregistered when reg is nil.
func counter(reg prometheus.Registerer, name, help string, labels ...string) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	if reg == nil {
		return c, nil
	}
	return promreg.Register(reg, c)
}
