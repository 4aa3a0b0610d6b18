// Package egress is how the consumer's engine reaches webhook endpoints:
// the HTTP client that never follows redirects, the dial-time address
// guard that keeps subscriptions without AllowPrivate off loopback,
// private, link-local (cloud metadata) and reserved addresses
// (ErrForbiddenAddress), and the mutual-TLS client of a subscription's
// TLS files. It knows nothing of JetStream or of deliveries.
package egress
