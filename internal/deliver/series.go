package deliver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
)

// subscriptionSeries are the metric vectors labelled by subscription, as
// registered on one Registerer: those of metrics, the rate limit gauge and
// the disabled gauge. A Fleet's units share them (promreg returns the
// vectors registered first), so the Fleet can delete a removed
// subscription's series, which would otherwise stay, frozen at their last
// value, until the process ends.
type subscriptionSeries []interface {
	DeletePartialMatch(prometheus.Labels) int
}

// newSubscriptionSeries registers (or finds) the vectors on reg; nil reg:
// none (nothing is exported, so nothing needs deleting).
func newSubscriptionSeries(reg prometheus.Registerer) (subscriptionSeries, error) {
	if reg == nil {
		return nil, nil
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	rate, err := attempt.NewRateGauge(reg)
	if err != nil {
		return nil, err
	}
	disabled, err := health.DisabledGauge(reg)
	if err != nil {
		return nil, err
	}
	return subscriptionSeries{m.deliveries, m.duration, m.inFlight, m.redeliveries, m.deadLetters, m.replayed,
		m.partitionsOwned, m.streamsParked, m.orderStuck, m.streamsAside, m.asideStuck, m.oldestHeld, m.fenceWaiting, m.fenceResets, m.handovers, rate, disabled}, nil
}

// forget deletes every series of subscription name.
func (s subscriptionSeries) forget(name string) {
	l := prometheus.Labels{"subscription": name}
	for _, v := range s {
		v.DeletePartialMatch(l)
	}
}
