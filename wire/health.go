package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// Endpoint health: the consumer replicas share each endpoint's circuit
// breaker and each subscription's disabled state in one JetStream
// key-value bucket, and announce an automatic disable on an operational
// subject (docs/wire.md, "Endpoint health").
const (
	// DefaultHealthBucket is the JetStream key-value bucket holding the
	// shared breaker records (BreakerKey), the disabled subscriptions
	// (DisabledKey) and the failure streaks (StreakKey). No TTL: a disabled subscription stays disabled until
	// `consumer subscriptions enable`.
	DefaultHealthBucket = "jsbridge_endpoint_health"
	// DefaultOpsStream is the JetStream stream the consumer creates (when
	// missing) to hold the operational events on "<OpsPrefix>.>".
	DefaultOpsStream = "JSBRIDGE_OPS"
	// OpsPrefix is the first subject token of operational events.
	OpsPrefix = "ops"
	// SubjectEndpointDisabled is the subject of the event published when a
	// subscription's endpoint is disabled automatically (410 Gone or
	// sustained failure). Body: JSON, see docs/wire.md.
	SubjectEndpointDisabled = OpsPrefix + ".endpoint.disabled"
	// OpsWebhookEndpointDisabled is the "type" of the operational webhook
	// sent to the operator's URL when an endpoint is disabled.
	OpsWebhookEndpointDisabled = "endpoint.disabled"
)

// DisabledKeyPrefix starts every DisabledKey.
const DisabledKeyPrefix = "disabled."

// DisabledKey is the health bucket key saying subscription is disabled:
// "disabled.<subscription>" (subscription names are [A-Za-z0-9_-]+, valid
// key tokens as they are). Its value is a JSON record (reason, last error,
// time); the key's absence means enabled.
func DisabledKey(subscription string) string { return DisabledKeyPrefix + subscription }

// StreakKeyPrefix starts every StreakKey.
const StreakKeyPrefix = "streak."

// StreakKey is the health bucket key of a subscription's failure streak:
// "streak.<subscription>". Its value is a JSON record {"since": <RFC 3339
// time of the first failure without a success since>}; a replica writes
// it once its own streak reached the minimum failures, and deletes it at
// the next 2xx from any replica, so the time part of the sustained-failure
// rule survives restarts and spans the replicas.
func StreakKey(subscription string) string { return StreakKeyPrefix + subscription }

// BreakerKeyPrefix starts every BreakerKey.
const BreakerKeyPrefix = "breaker."

// BreakerKey is the health bucket key of an endpoint's shared circuit
// breaker: "breaker.<hex sha-256 of the endpoint, first 16 bytes>". The
// endpoint is the breaker's rendering of the URL (scheme://host/path,
// without userinfo or query), which may hold characters a key may not.
func BreakerKey(endpoint string) string {
	sum := sha256.Sum256([]byte(endpoint))
	return BreakerKeyPrefix + hex.EncodeToString(sum[:16])
}
