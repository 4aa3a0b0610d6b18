// Package archtest holds no code: its tests keep the import rules of
// docs/architecture.md true. It lists the module's package graph with
// `go list -deps -json ./...` and checks, over each package's transitive
// (non-test) imports, that drain knows nothing of NATS or Postgres, forward
// nothing of Postgres, webhook nothing of NATS, event and wire nothing beyond the
// standard library. Two rules keep the front doors in front: no package
// under internal/ imports a front door (consumer, bridge, jsbridgetest),
// and only consumer, integration and bench import the consumer's engine
// (internal/deliver and its rooms), checked over every package's direct
// imports, tests included, so cmd/consumer reaches the engine through
// consumer alone (and consumer migrate's rooms, internal/migrate, beside
// it: the engine never imports them). The engine's rooms (the packages under
// internal/deliver/) sit below its root: none imports internal/deliver
// itself; and they form layers (engineLayers: shared on top,
// then inspect, attempt, fanout, the rooms that know no other, then
// subscription and egress), a room importing only rooms below it. A new
// import that breaks a rule fails `go test
// ./internal/archtest` with the path from the package to the forbidden one.
package archtest
