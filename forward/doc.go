// Package forward turns events into JetStream messages and publishes them:
// the message shape (on the subjects and with the headers package wire
// defines; Message: Nats-Msg-Id plus CloudEvents binary-mode headers, the
// event data as body), provisioning of the JetStream stream (Provision), and
// the Forwarder, the drain.Handler that publishes each stream's events
// strictly in order while different streams proceed concurrently, reconciles
// with JetStream before a takeover or a retry so that no event is stored
// twice even beyond the duplicate window, guards each publish (each fast
// batch) with the stream's expected last sequence so that a bridge that
// lost its lease cannot interleave, and sends a stream's new events as one
// JetStream fast batch where the server allows it (batch.go).
//
// It knows nothing of Postgres: it imports nats.go, event, wire and drain only.
//
// It is the engine behind the bridge front door, not an application API:
// applications run the bridge through package bridge (New, Start, Stop,
// Verify, Repair), which assembles store, drain and forward. This package
// keeps only the surface bridge and the bridge's metrics need, and may
// change between releases (see the README's API stability section).
package forward
