// Package deliver holds what the consumer's delivery paths share above
// the engine's rooms: replay by time (Window, WindowRun: the window's
// events POSTed once more to one subscription, outside the circuit
// breaker), the dead-letter replay's result and ordering fields
// (ReplayResult, ReplayOrder), and the delivery counters every path
// counts in (DeliveriesCounter, DeadLettersCounter, ReplayedCounter).
// The engine itself is internal/deliver/shared and the rooms under it.
package deliver
