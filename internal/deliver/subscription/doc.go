// Package subscription is the contract of one webhook subscription, as
// the consumer's engine (internal/deliver), the subscriptions bucket
// (internal/deliver/subkv) and the front door (consumer) all read it: the
// Subscription type, its enums (BodyMode, Ordering, DeadLetterPolicy),
// its defaults (the Default* values, WithDefaults), its validation
// (Validate, wrapping ErrInvalidSubscription and naming the field and the
// value), and where its position starts (Start, ParseStart;
// docs/subscriptions-start.md).
//
// It holds no behaviour of the engine and imports nothing of it: what a
// subscription is, not how it is delivered. Nothing here does I/O except
// Validate, which reads the TLS files to report a missing one by field
// and path.
package subscription
