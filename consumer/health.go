package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/health"
	"github.com/jsbridge/jsbridge/webhook"
)

// Endpoint health (docs/failing-endpoints.md): the replicas share each
// endpoint's circuit breaker and each subscription's disabled state in the
// JetStream key-value bucket "jsbridge_endpoint_health" (created on first
// use). A subscription is disabled by a 410 Gone from its endpoint, by
// HealthConfig.DisableAfter of failure, or by an operator
// (DisableSubscription); while disabled no replica sends to its endpoint
// and it keeps its position. EnableSubscription
// resumes it from where it stopped.

// Defaults of HealthConfig.
const (
	// DefaultDisableAfter is how long an endpoint may fail without a
	// success before its subscription is disabled (24 h).
	DefaultDisableAfter = health.DefaultDisableAfter
	// DefaultDisableMinFailures is the failed attempts DisableAfter also
	// needs (10).
	DefaultDisableMinFailures = health.DefaultDisableMinFailures
)

// Disable reasons (DisabledSubscription.Reason).
const (
	// ReasonGone: the endpoint answered 410 Gone.
	ReasonGone = health.ReasonGone
	// ReasonFailing: the endpoint failed without a success for
	// HealthConfig.DisableAfter.
	ReasonFailing = health.ReasonFailing
	// ReasonOperator: disabled with DisableSubscription (`consumer
	// subscriptions disable`).
	ReasonOperator = health.ReasonOperator
)

// HealthConfig configures the automatic disabling of subscriptions and
// its notification. Zero fields take their defaults.
type HealthConfig struct {
	// DisableAfter disables a subscription whose endpoint has failed
	// (5xx, timeouts, network errors; not 429) without a 2xx for this
	// long, once at least DisableMinFailures attempts failed. The time
	// is shared by the replicas and survives restarts (a key in the
	// health bucket); the attempts are counted on each replica.
	// Default DefaultDisableAfter (24 h); negative: never.
	DisableAfter time.Duration
	// DisableMinFailures: see DisableAfter. Default
	// DefaultDisableMinFailures (10).
	DisableMinFailures int
	// OpsWebhookURL receives a signed "endpoint.disabled" operational
	// webhook (JSON: type, timestamp, data) when a subscription is
	// disabled automatically. Default "": none. The event on the
	// JetStream subject "ops.endpoint.disabled" is published either way.
	OpsWebhookURL string
	// OpsWebhookSecret signs the operational webhook (Standard Webhooks,
	// a whsec_ secret). Required with OpsWebhookURL.
	OpsWebhookSecret string
}

// validate checks h: an error naming the field and the value (never the
// secret).
func (h HealthConfig) validate() error {
	if h.DisableMinFailures < 0 {
		return fmt.Errorf("Health.DisableMinFailures %d is negative", h.DisableMinFailures)
	}
	if h.OpsWebhookURL == "" {
		return nil
	}
	if _, err := webhook.NewSigner(webhook.SchemeStandard, h.OpsWebhookSecret); err != nil {
		return fmt.Errorf("Health.OpsWebhookSecret (for Health.OpsWebhookURL): %w", err)
	}
	return nil
}

// engine converts h into the engine's.
func (h HealthConfig) engine() health.Config {
	return health.Config{DisableAfter: h.DisableAfter, DisableMinFailures: h.DisableMinFailures,
		OpsWebhookURL: h.OpsWebhookURL, OpsWebhookSecret: h.OpsWebhookSecret}
}

// DisabledSubscription is a disabled subscription as the health bucket
// records it; it is also the body of the "ops.endpoint.disabled" event and
// the data of the "endpoint.disabled" operational webhook (JSON keys
// subscription, endpoint, reason, status, last_error, at, replica).
type DisabledSubscription = health.DisabledRecord

// OpsWebhook is the body of an operational webhook: {"type":
// "endpoint.disabled", "timestamp": ..., "data": DisabledSubscription}.
type OpsWebhook = health.OpsWebhook

// DisableSubscription disables subscription name on every replica running
// it (within a second), keeping its position; it announces nothing. A
// subscription already disabled keeps its record.
func DisableSubscription(ctx context.Context, js jetstream.JetStream, name string) error {
	return health.SetDisabled(ctx, nil, js, name, ReasonOperator)
}

// EnableSubscription enables subscription name: every replica resumes it
// from where it stopped. It reports whether it was disabled.
func EnableSubscription(ctx context.Context, js jetstream.JetStream, name string) (bool, error) {
	return health.Enable(ctx, js, name)
}

// ReadDisabled returns the disabled subscriptions, by name (none when the
// health bucket does not exist yet).
func ReadDisabled(ctx context.Context, js jetstream.JetStream) ([]DisabledSubscription, error) {
	return health.ReadDisabled(ctx, js)
}
