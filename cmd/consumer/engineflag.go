package main

import "github.com/jsbridge/jsbridge/consumer"

// engineFlag picks the engine of a command that replays (dlq replay,
// replay): the one `consumer run` delivers with, since each engine keeps
// its parked streams and skipped versions in its own place.
type engineFlag struct {
	Engine string `name:"engine" env:"JSBRIDGE_ENGINE" default:"auto" help:"The delivery engine the consumer runs with, as consumer run --engine: auto (the one consumer run picks from the server), shared (parked streams and skipped versions in the jsbridge_positions bucket; the events stream read with direct gets) or durables (default: ${default})."`
}

// apply sets cfg's engine, or names the bad value.
func (f engineFlag) apply(cfg *consumer.Config) error {
	e, err := engine(f.Engine)
	cfg.Engine = e
	return err
}
