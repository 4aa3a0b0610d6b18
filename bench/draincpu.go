package main

import (
	"fmt"
	"time"
)

// drainCPU is the CPU time (user + system) the drain row's processes used:
// the bridge process over its whole life (start-up included), this process
// (the embedded JetStream server, and the row's progress polls) while the
// bridge drained, and this process while the reference published the same
// messages (client and server in one).
type drainCPU struct {
	events                    int
	bridge, server, reference time.Duration
}

// perEvent is d in microseconds per drained event.
func (c drainCPU) perEvent(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(c.events)
}

// row is the "CPU per event, bridge ÷ nats-server" row (target ≤ 1.0).
func (c drainCPU) row() row {
	b, s, r := c.perEvent(c.bridge), c.perEvent(c.server), c.perEvent(c.reference)
	ratio := b / s
	return row{
		Name:      fmt.Sprintf("CPU per event during the drain row (%d events): the bridge process against the JetStream server (this process, while the bridge drained)", c.events),
		Ours:      fmt.Sprintf("bridge %.1f µs/event", b),
		Reference: fmt.Sprintf("JetStream server %.1f µs/event (the bare async publish: client and server %.1f µs/msg)", s, r),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≤ 1.0",
		Met:       ratio <= 1.0,
	}
}
