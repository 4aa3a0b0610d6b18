// Package archtest holds no code: its test keeps the import rules of
// docs/architecture.md true. It lists the module's package graph with
// `go list -deps -json ./...` and checks, over each package's transitive
// (non-test) imports, that drain knows nothing of NATS or Postgres, forward
// nothing of Postgres, webhook nothing of NATS, event and wire nothing beyond the
// standard library. A new import that breaks a rule fails `go test
// ./internal/archtest` with the path from the package to the forbidden one.
package archtest
