package attempt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/attemptlog"
	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/throttle"
	"github.com/jsbridge/jsbridge/internal/tracing"
	"github.com/jsbridge/jsbridge/webhook"
)

// Config is one subscription's attempts: what they send and to whom.
type Config struct {
	// Subscription is the subscription, validated and with its defaults
	// (subscription.Subscription.WithDefaults): its URL, body mode,
	// headers, Timeout, MaxDeliver, BackOff and RateLimit.
	Subscription subscription.Subscription
	// Signer signs every request (required); SetSigner replaces it.
	Signer *webhook.Signer
	// Client sends the POSTs (required): it must not follow redirects
	// (egress.NoRedirects) and carries the dial guard when the
	// subscription needs one.
	Client *http.Client
	// UserAgent is every request's User-Agent.
	UserAgent string
}

// Breaker is the endpoint's circuit breaker as an attempt uses it;
// *breaker.Breaker fills it.
type Breaker interface {
	// Execute runs fn unless the breaker is open (an error wrapping
	// breaker.ErrOpen), counting fn's error as a failure unless it wraps
	// breaker.ErrExcluded.
	Execute(fn func() error) error
	// State is the breaker's state, for spans and records.
	State() breaker.State
	// OpenTimeout is how long the breaker stays open.
	OpenTimeout() time.Duration
}

// Health is the subscriptions' disabled state as an attempt feeds and
// reads it; *health.State fills it (a nil *health.State: always
// enabled).
type Health interface {
	// Succeeded ends the subscription's failure streak.
	Succeeded(name string)
	// Failed counts a failure and reports whether the streak now
	// disables the subscription.
	Failed(name string) bool
	// Disable disables the subscription with rec.
	Disable(ctx context.Context, rec health.DisabledRecord)
	// IsDisabled reports whether the subscription is disabled.
	IsDisabled(name string) bool
	// WaitEnabled waits until the subscription is enabled, or for ctx.
	WaitEnabled(ctx context.Context, name string) error
}

// Metrics are the engine's collectors an attempt counts in.
type Metrics struct {
	// Deliveries is jsbridge_consumer_deliveries_total by subscription,
	// outcome and status_class (required).
	Deliveries *prometheus.CounterVec
	// Duration is the subscription's child of
	// jsbridge_consumer_attempt_duration_seconds (nil: not observed).
	Duration prometheus.Observer
	// Rate is the subscription's child of jsbridge_consumer_rate_limit
	// (throttle.NewRateGauge; nil: not shown).
	Rate prometheus.Gauge
}

// Deps are what a Sender takes from the engine.
type Deps struct {
	// Breaker is the endpoint's circuit breaker (required).
	Breaker Breaker
	// Health is the subscriptions' disabled state (nil: always enabled).
	Health Health
	// Archetype is the engine's clock and logger (nil: base.Default).
	// The clock is the throttle's, and it stamps and times each POST:
	// the signature's timestamp (the receiver checks it against its
	// own clock), the attempt's record and latency, a Retry-After date.
	// The logger logs the attempts, with the subscription and endpoint
	// attributes added.
	*base.Archetype
	// Tracer makes the attempt spans (nil: no-op).
	Tracer trace.Tracer
	// Metrics are the collectors counted in.
	Metrics Metrics
	// Attempts records the attempts Record keeps (nil: no records); it
	// must not block.
	Attempts attemptlog.Recorder
	// Record says which attempts go to Attempts. Default (""):
	// attemptlog.ModeFailures, every attempt but a success on the first
	// one. A value ParseMode refuses is an error.
	Record attemptlog.Mode
}

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("attempt: invalid config")

// New returns the Sender of cfg.Subscription. It fails, wrapping
// ErrInvalidConfig, when the signer, client, breaker or deliveries
// counter is missing or the URL does not parse.
func New(cfg Config, deps Deps) (*Sender, error) {
	s := cfg.Subscription
	switch {
	case cfg.Signer == nil:
		return nil, fmt.Errorf("%w: subscription %q: Signer is nil", ErrInvalidConfig, s.Name)
	case cfg.Client == nil:
		return nil, fmt.Errorf("%w: subscription %q: Client is nil", ErrInvalidConfig, s.Name)
	case deps.Breaker == nil:
		return nil, fmt.Errorf("%w: subscription %q: Deps.Breaker is nil", ErrInvalidConfig, s.Name)
	case deps.Metrics.Deliveries == nil:
		return nil, fmt.Errorf("%w: subscription %q: Deps.Metrics.Deliveries is nil", ErrInvalidConfig, s.Name)
	}
	record, err := attemptlog.ParseMode(string(deps.Record))
	if err != nil {
		return nil, fmt.Errorf("%w: subscription %q: Deps.Record: %w", ErrInvalidConfig, s.Name, err)
	}
	ep, err := newEndpoint(s.URL, cfg.Client)
	if err != nil {
		return nil, fmt.Errorf("%w: subscription %q: %w", ErrInvalidConfig, s.Name, err)
	}
	deps.Archetype = base.Default(deps.Archetype)
	if deps.Tracer == nil {
		deps.Tracer = tracing.Tracer(nil)
	}
	if deps.Health == nil {
		deps.Health = (*health.State)(nil)
	}
	if deps.Metrics.Duration == nil {
		deps.Metrics.Duration = noObserver{}
	}
	endpoint := breaker.Endpoint(s.URL)
	snd := &Sender{
		sub:        s,
		client:     cfg.Client,
		ep:         ep,
		br:         deps.Breaker,
		endpoint:   endpoint,
		log:        deps.Logger.With(slog.String("subscription", s.Name), slog.String("endpoint", endpoint)),
		static:     StaticHeaders(s.Headers, cfg.UserAgent),
		tracer:     deps.Tracer,
		spanName:   spanName(s.Name),
		clock:      deps.Clock,
		health:     deps.Health,
		throttle:   throttle.New(deps.Clock, s.RateLimit, deps.Metrics.Rate),
		deliveries: deps.Metrics.Deliveries,
		attempts:   deps.Attempts,
		record:     record,
		duration:   deps.Metrics.Duration,
		acked2xx: sync.OnceValue(func() prometheus.Counter {
			return deps.Metrics.Deliveries.WithLabelValues(s.Name, OutcomeAck, "2xx")
		}),
	}
	snd.signer.Store(cfg.Signer)
	return snd, nil
}

// noObserver observes nothing.
type noObserver struct{}

func (noObserver) Observe(float64) {}
