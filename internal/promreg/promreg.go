// Package promreg registers Prometheus collectors that several values of a
// type may share on one registry (two Consumers, two breaker Sets).
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it, or returns the collector of
// the same type already registered under the same descriptor, so that
// values built twice on one registry share their metrics. Any other
// registration failure (a descriptor clash) is returned wrapped, with
// "register metrics" and the cause.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metrics: %w", err)
}
