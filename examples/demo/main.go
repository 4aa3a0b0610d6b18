// Command demo runs jsbridge's main job on one machine, as `make run` and
// `make demo` do: a throwaway Postgres (scripts/pg), the bridge with an
// embedded JetStream server, a consumer subscribed to events.>, an example
// receiver (built on package webhook: verifies signatures, dedups on
// Idempotency-Key, logs each event) and a producer appending order events.
//
//	demo -mode run             steady producer, status once a second, until Ctrl-C
//	demo -mode check -n 20000  N events, then verify every one arrived once, in order
//	demo -cluster 3            either, on a 3-node JetStream cluster run in this process
//
// The bridge and the consumer run as real processes from -bin.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.Mode, "mode", "run", "run (until Ctrl-C) or check (N events, then verify and exit)")
	flag.IntVar(&cfg.N, "n", 20000, "check mode: number of events to append")
	flag.Float64Var(&cfg.Rate, "rate", 30, "run mode: events appended per second")
	flag.StringVar(&cfg.Bin, "bin", "bin", "directory holding the bridge and consumer binaries")
	flag.StringVar(&cfg.DataDir, "data", ".data", "directory for the embedded JetStream store (a fresh sub-directory per mode)")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL; empty starts the throwaway local one with scripts/pg")
	flag.IntVar(&cfg.Cluster, "cluster", 0, "run JetStream as an in-process cluster of this many nodes (e.g. 3) instead of the bridge's embedded server; the streams and consumers get as many replicas (at most 3)")
	flag.IntVar(&cfg.NatsPort, "nats-port", 0, "embedded NATS port (default: 4222 in run mode so the nats CLI finds it, a free port in check mode)")
	flag.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "check mode: give up when not every event has arrived by then")
	flag.BoolVar(&cfg.Quiet, "quiet", false, "do not log each received event")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
