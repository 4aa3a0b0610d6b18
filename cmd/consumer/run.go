package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/natsconn"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/internal/startup"
	"github.com/jsbridge/jsbridge/webhook"
)

// subscriptionFlags define the subscriptions: a file, or one subscription
// from flags. run and dlq replay take them.
type subscriptionFlags struct {
	Config string `name:"config" short:"c" env:"JSBRIDGE_CONFIG" type:"existingfile" help:"Subscriptions file (YAML); when given, the single-subscription and breaker flags below are not used."`

	Name          string          `name:"name" env:"JSBRIDGE_SUBSCRIPTION" default:"webhook" help:"Subscription name, also the durable consumer's name (default: ${default})."`
	URL           string          `name:"url" env:"JSBRIDGE_URL" help:"Endpoint URL the events are POSTed to (https, or http with --allow-http or --allow-private)."`
	Filter        []string        `name:"filter" env:"JSBRIDGE_FILTER" default:"${events_prefix}.>" help:"Filter subject(s), e.g. ${events_prefix}.order.> or ${events_prefix}.*.*.OrderShipped; repeatable or comma-separated (default: ${default})."`
	Secret        []string        `name:"secret" env:"JSBRIDGE_SECRET" help:"Signing secret(s): for standard, whsec_<base64> (HMAC, v1) or whsk_<base64> (ed25519 secret key, v1a; receivers verify with its whpk_ public key); several sign at once during rotation. Prefer the environment variable: flags show in ps."`
	Scheme        string          `name:"scheme" env:"JSBRIDGE_SCHEME" default:"standard" enum:"standard,hmac-sha256" help:"Signature scheme: standard (Standard Webhooks) or hmac-sha256 (X-Webhook-Signature) (default: ${default})."`
	Body          string          `name:"body" env:"JSBRIDGE_BODY" default:"structured" enum:"structured,binary" help:"Body mode: structured (CloudEvents JSON envelope) or binary (event data with ce-* headers) (default: ${default})."`
	Timeout       time.Duration   `name:"timeout" env:"JSBRIDGE_TIMEOUT" default:"10s" help:"Request timeout of one POST; an ordered POST is also cut at its partition's lease deadline (default: ${default})."`
	AckWait       time.Duration   `name:"ack-wait" env:"JSBRIDGE_ACK_WAIT" help:"Deprecated, ignored with a warning: the shared engine acks nothing, so nothing is redelivered after a wait. Removed in the next release."`
	MaxDeliver    int             `name:"max-deliver" env:"JSBRIDGE_MAX_DELIVER" default:"10" help:"Attempts per message; a retryable failure on the last one is dead-lettered; -1: no limit (default: ${default})."`
	BackOff       []time.Duration `name:"backoff" env:"JSBRIDGE_BACKOFF" default:"1s,5s,30s,2m,5m" help:"Delays before each retry; the last repeats (default: ${default})."`
	MaxInFlight   int             `name:"max-in-flight" env:"JSBRIDGE_CONSUMER_MAX_IN_FLIGHT" default:"64" help:"Concurrent deliveries per subscription (default: ${default})."`
	RateLimit     float64         `name:"rate-limit" env:"JSBRIDGE_RATE_LIMIT" help:"Most POSTs per second to the endpoint, per replica; a 429 (or 503 with Retry-After) lowers it for a while (default: no limit)."`
	MaxAckPending int             `name:"max-ack-pending" env:"JSBRIDGE_MAX_ACK_PENDING" help:"Events a partition holds in hand for the subscription (out for delivery or waiting for a retry), so up to --partitions times this in all; past it the subscription reads on from a cursor (default: 1000, or --max-in-flight when larger)."`
	AllowPrivate  bool            `name:"allow-private" env:"JSBRIDGE_ALLOW_PRIVATE" help:"Let the endpoint be on a loopback, private, link-local (cloud metadata) or reserved address, and use plain http (default: refused)."`
	AllowHTTP     bool            `name:"allow-http" env:"JSBRIDGE_ALLOW_HTTP" help:"Let the endpoint use plain http on a public address (default: https only)."`
	TLSClientCert string          `name:"tls-client-cert" env:"JSBRIDGE_TLS_CLIENT_CERT" help:"PEM client certificate (chain, leaf first) presented to the endpoint for mutual TLS; needs --tls-client-key (default: none)."`
	TLSClientKey  string          `name:"tls-client-key" env:"JSBRIDGE_TLS_CLIENT_KEY" help:"PEM private key of --tls-client-cert (PKCS #1, PKCS #8 or SEC 1) (default: none)."`
	TLSCA         string          `name:"tls-ca" env:"JSBRIDGE_TLS_CA" help:"PEM CA bundle that verifies the endpoint's certificate, in place of the system roots (default: system roots)."`

	Ordering     string `name:"ordering" env:"JSBRIDGE_ORDERING" default:"stream" enum:"stream,none" help:"stream: each source stream delivered in version order across every replica (head-of-line retry); none: maximum parallelism, no order (default: ${default})."`
	OnDeadLetter string `name:"on-dead-letter" env:"JSBRIDGE_ON_DEAD_LETTER" default:"park" enum:"park,skip" help:"With --ordering stream, what a dead-lettered event does to its stream: park (hold its later events until dlq replay or dlq skip) or skip (go on) (default: ${default})."`

	Start string `name:"start" env:"JSBRIDGE_START" default:"new" placeholder:"WHERE" help:"Where the subscription begins when it is first delivered: new (only events stored after the start), all (every event the stream holds), time:<RFC 3339> or sequence:<n> (the ${events_stream} stream's sequence, also when ordered); a subscription the positions bucket holds keeps its position (default: ${default})."`

	BreakerFailures     uint32        `name:"breaker-failures" env:"JSBRIDGE_BREAKER_FAILURES" default:"5" help:"Consecutive failures that open an endpoint's circuit breaker (default: ${default})."`
	BreakerFailureRatio float64       `name:"breaker-failure-ratio" env:"JSBRIDGE_BREAKER_FAILURE_RATIO" default:"0.5" help:"Share of failed requests, once --breaker-min-requests were seen in the breaker's interval, that also opens it (default: ${default})."`
	BreakerMinRequests  uint32        `name:"breaker-min-requests" env:"JSBRIDGE_BREAKER_MIN_REQUESTS" default:"20" help:"Requests seen in the breaker's interval before --breaker-failure-ratio applies (default: ${default})."`
	BreakerOpenTimeout  time.Duration `name:"breaker-open-timeout" env:"JSBRIDGE_BREAKER_OPEN_TIMEOUT" default:"30s" help:"How long an open breaker waits before letting a probe through (default: ${default})."`
}

// subscriptions returns the subscriptions and breaker settings of the file
// or of the flags.
func (f *subscriptionFlags) subscriptions() ([]consumer.Subscription, breaker.Settings, error) {
	if f.Config != "" {
		return loadSubscriptions(f.Config)
	}
	if f.URL == "" {
		return nil, breaker.Settings{}, errors.New("--url (JSBRIDGE_URL) is empty: give the endpoint URL, or a subscriptions file with --config")
	}
	var filters []string
	for _, v := range f.Filter {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				filters = append(filters, p)
			}
		}
	}
	start, err := consumer.ParseStart(f.Start)
	if err != nil {
		return nil, breaker.Settings{}, fmt.Errorf("--start (JSBRIDGE_START): %w", err)
	}
	tlsf, err := tlsFiles(
		tlsFile{"--tls-client-cert", f.TLSClientCert},
		tlsFile{"--tls-client-key", f.TLSClientKey},
		tlsFile{"--tls-ca", f.TLSCA})
	if err != nil {
		return nil, breaker.Settings{}, err
	}
	return []consumer.Subscription{{
			Name: f.Name, FilterSubjects: filters, URL: f.URL, Secrets: f.Secret,
			Scheme: webhook.Scheme(f.Scheme), Body: consumer.BodyMode(f.Body),
			Timeout: f.Timeout, MaxDeliver: f.MaxDeliver, BackOff: f.BackOff, MaxInFlight: f.MaxInFlight, MaxAckPending: f.MaxAckPending,
			RateLimit:    f.RateLimit,
			AllowPrivate: f.AllowPrivate, AllowHTTP: f.AllowHTTP, TLS: tlsf,
			Ordering: consumer.Ordering(f.Ordering), OnDeadLetter: consumer.DeadLetterPolicy(f.OnDeadLetter),
			Start: start,
		}}, breaker.Settings{
			ConsecutiveFailures: f.BreakerFailures, FailureRatio: f.BreakerFailureRatio, MinRequests: f.BreakerMinRequests,
			OpenTimeout: f.BreakerOpenTimeout,
		}, nil
}

// config maps the subscription flags (or file) to the consumer's
// configuration; replicas and the startup timeout are run's.
func (f *subscriptionFlags) config(g *Globals, log *slog.Logger, reg prometheus.Registerer, replicas int, startupTimeout time.Duration) (consumer.Config, error) {
	subs, bs, err := f.subscriptions()
	if err != nil {
		return consumer.Config{}, err
	}
	if f.Config == "" && f.AckWait != 0 {
		// A file's ack_wait is warned of by consumer.New, per subscription.
		log.Warn("--ack-wait (JSBRIDGE_ACK_WAIT) is deprecated and ignored: the shared engine does not use it (its reader acks nothing, so nothing is redelivered after a wait); remove it",
			slog.Duration("ack_wait", f.AckWait))
	}
	return consumer.Config{
		Subscriptions: subs, Breaker: bs, Stream: g.Stream, DLQStream: g.DLQStream,
		Replicas: replicas, StartupTimeout: startupTimeout, Logger: log, Registerer: reg,
	}, nil
}

// connect opens the NATS connection and its JetStream context, for the
// one-shot dlq commands: a server that is down is an error, not waited for.
func connect(g *Globals) (*nats.Conn, jetstream.JetStream, error) {
	conn, err := g.natsSettings()
	if err != nil {
		return nil, nil, err
	}
	opts := append([]nats.Option{nats.Name("jsbridge-consumer"), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}, conn.Options()...)
	nc, err := nats.Connect(conn.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", startup.RedactURL(conn.URL), err)
	}
	if err := startup.CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", startup.RedactURL(conn.URL), err)
	}
	js, err := conn.JetStream(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// orderingFlags configure ordered subscriptions (--ordering stream).
type orderingFlags struct {
	Partitions      int           `name:"partitions" env:"JSBRIDGE_PARTITIONS" default:"16" help:"Partitions of ordered delivery: the unit of ownership among replicas (at most this many replicas share an ordered subscription); the same on every replica (default: ${default})."`
	ReplicaID       string        `name:"replica-id" env:"JSBRIDGE_REPLICA_ID" help:"This replica's id in partition leases, consumer status and the Jsbridge-Replica webhook header: [A-Za-z0-9_-]+ (default: <hostname>-<pid>-<random>)."`
	LeaseTTL        time.Duration `name:"lease-ttl" env:"JSBRIDGE_LEASE_TTL" default:"10s" help:"Lifetime of a partition lease and a membership heartbeat unless renewed (every quarter of it): a killed or frozen replica's partitions move after at most this; fixed when the lease bucket is created: a replica finding the bucket with another TTL uses the bucket's and warns (default: ${default})."`
	OrderStuckAfter time.Duration `name:"order-stuck-after" env:"JSBRIDGE_ORDER_STUCK_AFTER" default:"5m" help:"How long a receiver's order gate may refuse an ordered stream's head (409 gap or in-progress) before the head is dead-lettered and its stream parked as order-stuck, whatever on_dead_letter says; out with consumer dlq replay or skip (default: ${default})."`
}

type runCmd struct {
	subscriptionFlags `embed:""`
	orderingFlags     `embed:""`
	kvFlags           `embed:""` // run_kv.go
	engineFlag        `embed:""` // deprecated

	StartupTimeout time.Duration `name:"startup-timeout" env:"JSBRIDGE_STARTUP_TIMEOUT" default:"0s" help:"Give up (exit 1, naming what is missing) when NATS, the JetStream stream or the DLQ stream are not available within this time; 0 waits forever (default: ${default})."`
	Pprof          bool          `name:"pprof" env:"JSBRIDGE_PPROF" help:"Serve Go profiles under /debug/pprof/ on the ops port."`
	OpsAddr        string        `name:"ops-addr" env:"JSBRIDGE_CONSUMER_OPS_ADDR" default:"127.0.0.1:9465" help:"Address of the ops port serving /metrics, /healthz and /readyz; empty disables it (default: ${default})."`
	attemptsFlags  `embed:""`
	healthFlags    `embed:""`

	obs observers // tracing and the attempts record, set up by Run (trace.go)
}

// Run validates the configuration, starts the ops port, then waits for
// NATS and lets the consumer package wait for the DLQ stream and the
// events stream (consumer.Provision, with the same startup.Waiter) and
// delivers until ctx ends. It fails only for what waiting cannot fix, or
// at --startup-timeout; a stop while it waits is a clean exit.
func (r *runCmd) Run(ctx context.Context, g *Globals) error {
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	// Validate the configuration before touching the network.
	conn, err := g.natsSettings()
	if err != nil {
		return err
	}
	if r.StreamReplicas < 1 {
		return fmt.Errorf("--stream-replicas (JSBRIDGE_STREAM_REPLICAS) %d: want 1 or more", r.StreamReplicas)
	}
	opsSrv := ops.NewServer()
	cfg, err := r.runConfig(g, log, opsSrv.Registry)
	if err != nil {
		return err
	}
	cfg.Partitions, cfg.ReplicaID, cfg.LeaseTTL, cfg.OrderStuckAfter = r.Partitions, r.ReplicaID, r.LeaseTTL, r.OrderStuckAfter
	if err := r.check(log); err != nil {
		return err
	}
	if cfg.Health, err = r.health(); err != nil {
		return err
	}
	if r.obs.attempts, err = r.attemptsConfig(g, log); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return withFlagHints(err)
	}
	names := make([]string, len(cfg.Subscriptions))
	for i, s := range cfg.Subscriptions {
		names[i] = s.Name
	}
	if cfg.SubscriptionStore != nil {
		names = []string{"kv bucket " + r.Bucket}
	}

	// The ops port comes first: /healthz answers and /readyz says what is
	// waited for while the dependencies are not there yet.
	w := startup.New(log, r.StartupTimeout)
	var jsRef startup.JetStreamRef
	opsSrv.AddCheck("startup", w.Check)
	opsSrv.AddCheck("jetstream", jsRef.StreamCheck(g.Stream))
	opsSrv.AddCheck("dlq", jsRef.StreamCheck(g.DLQStream))
	opsSrv.Pprof = r.Pprof
	addr, err := opsSrv.Start(r.OpsAddr)
	if err != nil {
		return err
	}
	defer opsSrv.Stop()
	shutdown, err := r.observe(ctx, log)
	if err != nil {
		return err
	}
	defer shutdown()

	nc, c, err := r.start(ctx, w, g, conn, log, cfg, &jsRef)
	if nc != nil {
		defer nc.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			log.Info("consumer stopped while starting", "error", err)
			return nil
		}
		return err
	}
	w.Ready()
	log.Info("consumer started", "nats_url", startup.RedactURL(nc.ConnectedUrl()), "jetstream_stream", g.Stream, "dlq_stream", g.DLQStream,
		"subscriptions", strings.Join(names, ","), "ops_addr", addr)
	err = c.Run(ctx)
	log.Info("consumer stopped")
	return err
}

// start connects to NATS, waited for with w, assembles the consumer and
// provisions it (the attempts stream, the DLQ stream and the events
// stream, waited for with the same w), and returns the connection (to close, also on error) and
// the consumer.
func (r *runCmd) start(ctx context.Context, w *startup.Waiter, g *Globals, conn natsconn.Settings, log *slog.Logger, cfg consumer.Config, jsRef *startup.JetStreamRef) (*nats.Conn, *consumer.Consumer, error) {
	log.Info("connecting to NATS", "nats_url", startup.RedactURL(conn.URL), "nats_auth", conn.Auth, "nats_tls", conn.TLS, "jetstream_api", conn.JetStreamAPI())
	// No reconnect buffer: an ack or InProgress written while the
	// connection is down fails instead of going out after the reconnect,
	// maybe after the partition lease ended (see consumer.Config).
	opts := append(startup.NATSOptions(log, "jsbridge-consumer"), nats.ReconnectBufSize(-1))
	nc, err := startup.ConnectNATS(ctx, w, conn.URL, append(opts, conn.Options()...)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := conn.JetStream(nc)
	if err != nil {
		return nc, nil, fmt.Errorf("jetstream: %w", err)
	}
	jsRef.Set(js)
	if warning := startup.ReplicasWarning(r.StreamReplicas, nc.ConnectedServerName(), nc.ConnectedClusterName()); warning != "" {
		log.Warn(warning, "replicas", r.StreamReplicas)
	}
	cfg.TracerProvider, cfg.Attempts = r.obs.tracerProvider, r.obs.attempts
	if err := r.openKV(ctx, w, js, &cfg); err != nil {
		return nc, nil, err
	}
	c, err := consumer.New(js, cfg)
	if err != nil {
		return nc, nil, err
	}
	if err := c.Provision(startup.WithWaiter(ctx, w)); err != nil {
		return nc, c, err
	}
	warnMemoryStorage(ctx, js, log, map[string]string{cfg.Stream: "events not delivered yet", cfg.DLQStream: "dead letters"})
	return nc, c, nil
}

// warnMemoryStorage logs a warning for each of streams (name -> what it
// holds) kept in memory. A stream that cannot be looked up now is passed
// over: it exists (start-up just waited for it), and this is advice.
func warnMemoryStorage(ctx context.Context, js jetstream.JetStream, log *slog.Logger, streams map[string]string) {
	for name, holds := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			continue
		}
		if warning := startup.MemoryStorageWarning(name, holds, s.CachedInfo().Config.Storage); warning != "" {
			log.Warn(warning, "jetstream_stream", name)
		}
	}
}
