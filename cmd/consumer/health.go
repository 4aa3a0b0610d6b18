package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
)

// healthFlags configure the automatic disabling of subscriptions and its
// operational webhook (run's).
type healthFlags struct {
	DisableAfter       time.Duration `name:"disable-after" env:"JSBRIDGE_DISABLE_AFTER" default:"24h" help:"Disable a subscription whose endpoint failed (5xx, timeouts, network errors) without a 2xx for this long, across at least --disable-min-failures attempts; a 410 Gone disables at once; negative: never (default: ${default})."`
	DisableMinFailures int           `name:"disable-min-failures" env:"JSBRIDGE_DISABLE_MIN_FAILURES" default:"10" help:"Failed attempts --disable-after also needs (default: ${default})."`
	OpsWebhookURL      string        `name:"ops-webhook-url" env:"JSBRIDGE_OPS_WEBHOOK_URL" help:"Operator URL receiving a signed endpoint.disabled webhook when a subscription is disabled automatically (default: none; the ops.endpoint.disabled event is published either way)."`
	OpsWebhookSecret   string        `name:"ops-webhook-secret" env:"JSBRIDGE_OPS_WEBHOOK_SECRET" help:"whsec_ secret signing the operational webhook (Standard Webhooks); required with --ops-webhook-url. Prefer the environment variable: flags show in ps."`
}

// health returns the consumer's HealthConfig of the flags.
func (f healthFlags) health() (consumer.HealthConfig, error) {
	if f.OpsWebhookURL != "" && f.OpsWebhookSecret == "" {
		return consumer.HealthConfig{}, fmt.Errorf("--ops-webhook-url is set without --ops-webhook-secret (JSBRIDGE_OPS_WEBHOOK_SECRET)")
	}
	return consumer.HealthConfig{DisableAfter: f.DisableAfter, DisableMinFailures: f.DisableMinFailures,
		OpsWebhookURL: f.OpsWebhookURL, OpsWebhookSecret: f.OpsWebhookSecret}, nil
}

// subscriptionsHealthCmds are the `consumer subscriptions` commands of
// endpoint health: enable and disable.
type subscriptionsHealthCmds struct {
	Enable  subscriptionsEnableCmd  `cmd:"" help:"Enable a disabled subscription (410 Gone, sustained failure or disable): every replica resumes it from where it stopped."`
	Disable subscriptionsDisableCmd `cmd:"" help:"Disable a subscription: every replica stops sending to its endpoint within a second; its position is kept, nothing is dead-lettered."`
}

type subscriptionsEnableCmd struct {
	Name string    `arg:"" help:"Subscription name."`
	out  io.Writer // stdout; tests set it
}

func (c *subscriptionsEnableCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	was, err := consumer.EnableSubscription(ctx, js, c.Name)
	if err != nil {
		return err
	}
	if !was {
		fmt.Fprintf(out(c.out), "subscription %s was not disabled\n", c.Name)
		return nil
	}
	fmt.Fprintf(out(c.out), "subscription %s enabled: the replicas resume it from where it stopped\n", c.Name)
	return nil
}

type subscriptionsDisableCmd struct {
	Name string    `arg:"" help:"Subscription name."`
	out  io.Writer // stdout; tests set it
}

func (c *subscriptionsDisableCmd) Run(ctx context.Context, g *Globals) error {
	nc, js, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := consumer.DisableSubscription(ctx, js, c.Name); err != nil {
		return err
	}
	fmt.Fprintf(out(c.out), "subscription %s disabled: nothing is sent to its endpoint until `consumer subscriptions enable %s`\n", c.Name, c.Name)
	return nil
}

// printDisabled prints the disabled subscriptions (status's first table),
// or nothing when none is.
func printDisabled(ctx context.Context, js jetstream.JetStream, w io.Writer) error {
	recs, err := consumer.ReadDisabled(ctx, js)
	if err != nil || len(recs) == 0 {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DISABLED\tREASON\tSINCE\tLAST ERROR\n")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Subscription, r.Reason, r.At.UTC().Format(time.RFC3339), cmp.Or(r.LastError, "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(resume with: consumer subscriptions enable NAME)")
	fmt.Fprintln(w)
	return nil
}
