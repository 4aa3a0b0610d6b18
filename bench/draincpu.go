package main

import (
	"fmt"
	"runtime"
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
	// postgres is the Postgres server's processes' CPU while the bridge
	// drained (0 when not read).
	postgres time.Duration
	// wall and refWall are how long the bridge's drain and the reference's
	// publishing took.
	wall, refWall time.Duration
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
		Ours:      fmt.Sprintf("bridge %.1f µs/event (%s)", b, c.budget()),
		Reference: fmt.Sprintf("JetStream server %.1f µs/event (the bare async publish: client and server %.1f µs/msg, %s)", s, r, c.cores(c.reference, c.refWall)),
		Ratio:     fmt.Sprintf("%.2f", ratio),
		Target:    "≤ 1.0",
		Met:       ratio <= 1.0,
	}
}

// budget says what the drain's processes used together: CPU per event of
// the bridge, Postgres and the JetStream server, and how many of the
// machine's cores that kept busy on average (the drain is CPU-bound when
// it is close to runtime.NumCPU()).
func (c drainCPU) budget() string {
	all := c.bridge + c.postgres + c.server
	return fmt.Sprintf("Postgres %.1f µs/event; bridge + Postgres + server %.1f µs/event, %s", c.perEvent(c.postgres), c.perEvent(all), c.cores(all, c.wall))
}

// cores is cpu spent over wall as a number of busy cores, of the machine's.
func (c drainCPU) cores(cpu, wall time.Duration) string {
	if wall <= 0 {
		return "cores busy unknown"
	}
	return fmt.Sprintf("%.2f of %d cores busy", cpu.Seconds()/wall.Seconds(), runtime.NumCPU())
}
