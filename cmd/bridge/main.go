// Command bridge drains an application's Postgres event store into NATS
// JetStream: it claims streams under a lease, publishes their events in
// stream order with Nats-Msg-Id = event id, and advances each stream's
// watermark, retries with backoff, or blocks the stream.
//
// Subcommands: run, migrate, append, streams, unblock, reset, retention, verify,
// version, probe. See --help.
package main

import "github.com/jsbridge/jsbridge/internal/ops"

// cli is the whole command line; kong builds --help from the tags.
type cli struct {
	Globals

	CLIReference cliReferenceCmd `cmd:"" name:"cli-reference" hidden:"" help:"Print the command-line reference (docs/cli.md) generated from the flags."`

	Run       runCmd         `cmd:"" help:"Drain events from Postgres into JetStream until SIGINT/SIGTERM."`
	Migrate   migrateCmd     `cmd:"" help:"Create or upgrade the bridge's tables in Postgres, then exit."`
	Append    appendCmd      `cmd:"" help:"Append one event to a stream (for trying things from the shell)."`
	Streams   streamsCmd     `cmd:"" help:"List streams: watermark, head, lag, retry, blocked, lease."`
	Unblock   unblockCmd     `cmd:"" help:"Unblock streams (by name, --match REGEX or --all); they resume from their watermark."`
	Reset     resetCmd       `cmd:"" help:"Forward streams again from their first event; refuses without --yes."`
	Retention retentionCmd   `cmd:"" help:"Show the events stream's retention (max age, bytes, messages per subject) and the consumer's streams that follow it; with --max-age, --max-bytes or --max-msgs-per-subject and --yes, change it on the existing stream."`
	Verify    verifyCmd      `cmd:"" help:"Compare Postgres with JetStream up to each stream's watermark: missing, duplicate, out-of-order and differing events; --repair re-publishes missing tails. Exit 0 clean, 1 problems, 2 trouble."`
	Version   ops.VersionCmd `cmd:"" help:"Print the version, commit and build date of this binary."`
	Probe     ops.ProbeCmd   `cmd:"" help:"GET a URL (the ops port's /readyz) and exit 0 on 2xx, 1 otherwise: a health check for the image, which has no shell."`

	ShowVersion ops.VersionFlag `name:"version" help:"Print the version and exit."`
}

// Globals are the flags every subcommand takes.
type Globals struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" help:"Postgres URL, e.g. postgres://user@host:5432/db. Required."`
	Schema      string `name:"schema" env:"JSBRIDGE_SCHEMA" default:"jsbridge" help:"Postgres schema holding the bridge's tables (streams, and events unless --events-table) (default: ${default})."`
	EventsTable string `name:"events-table" env:"JSBRIDGE_EVENTS_TABLE" help:"Drain an existing events table of the common layout (id, stream, version, name, data, meta, created) that another program writes, as schema.table; the bridge never changes it and finds new events by polling. Default: the bridge's own <schema>.events."`
	LogFormat   string `name:"log-format" env:"JSBRIDGE_LOG_FORMAT" default:"text" enum:"text,json" help:"Log format: text or json (default: ${default})."`
	LogLevel    string `name:"log-level" env:"JSBRIDGE_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level: debug, info, warn or error (default: ${default})."`
}

func main() {
	var c cli
	ops.RunCLI("bridge", "jsbridge bridge: forwards events from a Postgres event store to NATS JetStream.", &c, &c.Globals, renamed...)
}
