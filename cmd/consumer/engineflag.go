package main

import (
	"fmt"
	"log/slog"
)

// engineFlag is --engine (JSBRIDGE_ENGINE) of consumer run, dlq replay and
// replay, deprecated: the shared engine is the only engine. It stays one
// release so that a deployment still setting it starts (auto, shared:
// one warning) or is told how to move (durables: refused, naming
// consumer migrate). It goes in the next release.
type engineFlag struct {
	Engine string `name:"engine" env:"JSBRIDGE_ENGINE" placeholder:"ENGINE" help:"Deprecated, does nothing: the shared engine is the only engine. auto and shared are accepted with a warning; durables is refused: a deployment that ran it moves with consumer migrate, every old replica stopped (docs/operations.md, Upgrading from a release that ran the durables engine). Removed in the next release."`
}

// check warns once that a --engine given does nothing (auto, shared),
// or refuses durables, naming the flag, the value and consumer migrate,
// and any other value, naming the flag and the value.
func (f engineFlag) check(log *slog.Logger) error {
	switch f.Engine {
	case "":
		return nil
	case "auto", "shared":
		log.Warn("--engine (JSBRIDGE_ENGINE) is deprecated and does nothing: the shared engine is the only engine; remove the flag", slog.String("engine", f.Engine))
		return nil
	case "durables":
		return fmt.Errorf("--engine (JSBRIDGE_ENGINE) %q: the durables engine was removed; stop every replica of the earlier release, run `consumer migrate` (docs/operations.md, \"Upgrading from a release that ran the durables engine\"), then start this one without --engine", f.Engine)
	}
	return fmt.Errorf("--engine (JSBRIDGE_ENGINE) %q: deprecated, and does nothing: remove it (it accepted auto and shared)", f.Engine)
}
