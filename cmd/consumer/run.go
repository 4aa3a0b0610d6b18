package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/deliver"
	"github.com/jsbridge/jsbridge/internal/ops"
	"github.com/jsbridge/jsbridge/webhook"
)

type runCmd struct {
	Config string `name:"config" short:"c" env:"JSBRIDGE_CONFIG" type:"existingfile" help:"Subscriptions file (YAML); when given, the single-subscription flags below are not used."`

	Name        string          `name:"name" env:"JSBRIDGE_SUBSCRIPTION" default:"webhook" help:"Subscription name, also the durable consumer's name (default: ${default})."`
	URL         string          `name:"url" env:"JSBRIDGE_URL" help:"Endpoint URL the events are POSTed to."`
	Filter      []string        `name:"filter" env:"JSBRIDGE_FILTER" default:"events.>" help:"Filter subject(s), e.g. events.order.> or events.*.*.OrderShipped; repeatable or comma-separated (default: ${default})."`
	Secret      []string        `name:"secret" env:"JSBRIDGE_SECRET" help:"Signing secret(s) (whsec_<base64> for standard); several sign at once during rotation. Prefer the environment variable: flags show in ps."`
	Scheme      string          `name:"scheme" env:"JSBRIDGE_SCHEME" default:"standard" enum:"standard,hmac-sha256" help:"Signature scheme: standard (Standard Webhooks) or hmac-sha256 (X-Webhook-Signature) (default: ${default})."`
	Body        string          `name:"body" env:"JSBRIDGE_BODY" default:"structured" enum:"structured,binary" help:"Body mode: structured (CloudEvents JSON envelope) or binary (event data with ce-* headers) (default: ${default})."`
	Timeout     time.Duration   `name:"timeout" env:"JSBRIDGE_TIMEOUT" default:"10s" help:"Request timeout of one POST; keep it below --ack-wait (default: ${default})."`
	AckWait     time.Duration   `name:"ack-wait" env:"JSBRIDGE_ACK_WAIT" default:"30s" help:"JetStream AckWait: a message not acked by then is redelivered (default: ${default})."`
	MaxDeliver  int             `name:"max-deliver" env:"JSBRIDGE_MAX_DELIVER" default:"10" help:"JetStream MaxDeliver: attempts per message (default: ${default})."`
	BackOff     []time.Duration `name:"backoff" env:"JSBRIDGE_BACKOFF" default:"1s,5s,30s,2m,5m" help:"Delays before each retry; the last repeats (default: ${default})."`
	MaxInFlight int             `name:"max-in-flight" env:"JSBRIDGE_MAX_IN_FLIGHT" default:"64" help:"Concurrent deliveries per subscription (default: ${default})."`

	BreakerFailures    uint32        `name:"breaker-failures" env:"JSBRIDGE_BREAKER_FAILURES" default:"5" help:"Consecutive failures that open an endpoint's circuit breaker (default: ${default})."`
	BreakerOpenTimeout time.Duration `name:"breaker-open-timeout" env:"JSBRIDGE_BREAKER_OPEN_TIMEOUT" default:"30s" help:"How long an open breaker waits before letting a probe through (default: ${default})."`

	OpsAddr string `name:"ops-addr" env:"JSBRIDGE_OPS_ADDR" default:"127.0.0.1:9465" help:"Address of the ops port serving /metrics, /healthz and /readyz; empty disables it (default: ${default})."`
}

func (r *runCmd) subscriptions() ([]deliver.Subscription, error) {
	if r.Config != "" {
		return loadSubscriptions(r.Config)
	}
	if r.URL == "" {
		return nil, errors.New("--url (JSBRIDGE_URL) is empty: give the endpoint URL, or a subscriptions file with --config")
	}
	var filters []string
	for _, f := range r.Filter {
		for _, p := range strings.Split(f, ",") {
			if p = strings.TrimSpace(p); p != "" {
				filters = append(filters, p)
			}
		}
	}
	return []deliver.Subscription{{
		Name: r.Name, FilterSubjects: filters, URL: r.URL, Secrets: r.Secret,
		Scheme: webhook.Scheme(r.Scheme), Body: deliver.BodyMode(r.Body),
		Timeout: r.Timeout, AckWait: r.AckWait, MaxDeliver: r.MaxDeliver, BackOff: r.BackOff, MaxInFlight: r.MaxInFlight,
	}}, nil
}

func (r *runCmd) Run(ctx context.Context, g *Globals) error {
	log, err := ops.NewLogger(os.Stderr, g.LogFormat, g.LogLevel)
	if err != nil {
		return err
	}
	subs, err := r.subscriptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(g.NatsURL, nats.Name("jsbridge-consumer"), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("connect --nats-url %q: %w", g.NatsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	opsSrv := ops.NewServer()
	breakers, err := breaker.NewSet(breaker.Settings{
		ConsecutiveFailures: r.BreakerFailures, OpenTimeout: r.BreakerOpenTimeout,
	}, log, opsSrv.Registry)
	if err != nil {
		return err
	}
	c, err := deliver.New(js, deliver.Config{Stream: g.Stream, Breakers: breakers, Logger: log, Registerer: opsSrv.Registry}, subs...)
	if err != nil {
		return err
	}
	opsSrv.AddCheck("jetstream", func(ctx context.Context) error {
		_, err := js.Stream(ctx, g.Stream)
		return err
	})
	addr, err := opsSrv.Start(r.OpsAddr)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = opsSrv.Shutdown(sctx)
	}()
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name
	}
	log.Info("consumer started", "nats_url", nc.ConnectedUrl(), "jetstream_stream", g.Stream, "subscriptions", strings.Join(names, ","), "ops_addr", addr)
	err = c.Run(ctx)
	log.Info("consumer stopped")
	return err
}
