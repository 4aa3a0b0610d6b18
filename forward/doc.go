// Package forward turns events into JetStream messages and publishes them:
// the subject mapping (Subject, ParseSubject, EscapeToken), the message
// shape (Message: Nats-Msg-Id plus CloudEvents binary-mode headers, the
// event data as body), provisioning of the JetStream stream (Provision), and
// the Forwarder, the drain.Handler that publishes each stream's events
// strictly in order while different streams proceed concurrently.
//
// It knows nothing of Postgres: it imports nats.go, event and drain only.
package forward
