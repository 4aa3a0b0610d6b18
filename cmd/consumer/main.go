// Command consumer delivers events from JetStream to HTTP webhook endpoints:
// one reader of the events stream per replica, partitions leased among
// the replicas, signed POSTs carrying an Idempotency-Key, retries with
// backoff and a circuit breaker per endpoint.
//
// Subcommands: run, status, trace, migrate, secret, replay, dlq list, dlq replay,
// dlq skip, dlq purge, subscriptions (add, update, get, list, delete, pause,
// resume, enable, disable, import, export, keygen, reseal), version, probe.
// See --help.
package main

import (
	"os"
	"runtime/debug"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/ops"
)

type cli struct {
	Globals

	CLIReference cliReferenceCmd `cmd:"" name:"cli-reference" hidden:"" help:"Print the command-line reference (docs/cli.md) generated from the flags."`

	Run     runCmd         `cmd:"" help:"Deliver events to the subscriptions' endpoints until SIGINT/SIGTERM."`
	DLQ     dlqCmd         `cmd:"" name:"dlq" help:"List, replay, skip or purge dead letters (the DLQ stream)."`
	Replay  replayCmd      `cmd:"" help:"POST what the events stream holds in a time window once more to one subscription's endpoint (same signing, Idempotency-Key = event id), in stream order, an ordered subscription's with the version chain (Jsbridge-Previous-Version: each stream's last event before the window its filters select, then the one before in the window); its durable consumers are left as they are."`
	Status  statusCmd      `cmd:"" help:"Show each subscription's start and position, the live consumer replicas, which one owns each partition of the ordered subscriptions, and their stuck streams (parked, order-stuck, set aside) with the command out of each."`
	Secret  secretCmd      `cmd:"" help:"Print a new whsec_ signing secret for --secret and the receiver (--ed25519: a whsk_/whpk_ key pair)."`
	Migrate migrateCmd     `cmd:"" help:"Move the ordered copy's partition consumers, the unordered durables and the park bucket's records to the shared engine's positions bucket (jsbridge_positions), once, with every consumer replica stopped; --dry-run prints the plan and writes nothing. The old layout is left in place until --cleanup deletes it, once the new version runs."`
	Trace   traceCmd       `cmd:"" help:"Show one event's recorded delivery attempts per subscription (time, replica, status, latency, error; failures, and the success ending them, unless run keeps every attempt with --attempts-record all), its message on the events stream, its dead letters, and where each subscription stands from the positions bucket (settled, outstanding, pending)."`
	Version ops.VersionCmd `cmd:"" help:"Print the version, commit and build date of this binary."`
	Probe   ops.ProbeCmd   `cmd:"" help:"GET a URL (the ops port's /readyz) and exit 0 on 2xx, 1 otherwise: a health check for the image, which has no shell."`

	// Subscriptions manages the subscriptions bucket (subscriptions.go).
	Subscriptions subscriptionsCmd `cmd:"" help:"Manage the subscriptions kept in a JetStream key-value bucket, which replicas run with --subscriptions-from kv apply without a restart: add, update, get, list, delete, pause, resume, enable, disable, import, export, keygen, reseal."`

	ShowVersion ops.VersionFlag `name:"version" help:"Print the version and exit."`
}

// Globals are the flags every subcommand takes.
type Globals struct {
	NatsURL        string `name:"nats-url" env:"NATS_URL" help:"NATS server URL(s), comma-separated (default: the --context's url, else nats://127.0.0.1:4222)."`
	natsconn.Flags `embed:""`
	Stream         string `name:"stream" env:"JSBRIDGE_STREAM" default:"${events_stream}" help:"JetStream stream the bridge publishes to (default: ${default})."`
	DLQStream      string `name:"dlq-stream" env:"JSBRIDGE_DLQ_STREAM" default:"${dlq_stream}" help:"JetStream stream holding dead letters on ${dlq_prefix}.<subscription>.>; created at start when missing (default: ${default})."`
	AttemptsStream string `name:"attempts-stream" env:"JSBRIDGE_ATTEMPTS_STREAM" default:"${attempts_stream}" help:"JetStream stream of attempt records on ${attempts_prefix}.<subscription>.<event id>, read by trace; created at start when missing (default: ${default})."`
	LogFormat      string `name:"log-format" env:"JSBRIDGE_LOG_FORMAT" default:"text" enum:"text,json" help:"Log format: text or json (default: ${default})."`
	LogLevel       string `name:"log-level" env:"JSBRIDGE_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level: debug, info, warn or error (default: ${default})."`
}

// defaultGCPercent is the GC target when GOGC is not set: the consumer's
// live heap is a few MB, so GOGC=100 collects very often at full speed;
// 400 trades a few MB of RSS for fewer collections (docs/performance.md).
const defaultGCPercent = 400

// natsSettings resolves the NATS flags and the --context into where and
// how to connect; without a URL from either it is nats.DefaultURL.
func (g *Globals) natsSettings() (natsconn.Settings, error) {
	conn, err := g.Flags.Resolve(g.NatsURL)
	if err != nil {
		return natsconn.Settings{}, err
	}
	if conn.URL == "" {
		conn.URL = nats.DefaultURL
	}
	return conn, nil
}

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	var c cli
	ops.RunCLI("consumer", "jsbridge consumer: delivers events from NATS JetStream to signed HTTP webhooks.", &c, &c.Globals, renamed...)
}
