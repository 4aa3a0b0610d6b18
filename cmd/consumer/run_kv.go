package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/consumer"
	"github.com/jsbridge/jsbridge/internal/startup"
)

// kvFlags choose where run's subscriptions come from: the subscriptions
// file or flags (config, the default), or the subscriptions bucket (kv),
// watched while it runs (docs/subscriptions-kv.md).
type kvFlags struct {
	SubscriptionsFrom string `name:"subscriptions-from" env:"JSBRIDGE_CONSUMER_SUBSCRIPTIONS_FROM" default:"config" enum:"config,kv" help:"Where the subscriptions come from: config (--config file, or the single-subscription flags; read once at start) or kv (the subscriptions bucket, watched: changes made with consumer subscriptions apply without a restart; needs --secrets-key-file) (default: ${default})."`
	storeFlags        `embed:""`
}

// runConfig is config, or with --subscriptions-from kv a configuration
// without subscriptions (openKV adds the store once NATS is connected)
// and with the breaker flags.
func (r *runCmd) runConfig(g *Globals, log *slog.Logger, reg prometheus.Registerer) (consumer.Config, error) {
	if r.SubscriptionsFrom != "kv" {
		return r.config(g, log, reg, r.StreamReplicas, r.StartupTimeout)
	}
	if r.Config != "" {
		return consumer.Config{}, fmt.Errorf("--config %s with --subscriptions-from kv: give one source of subscriptions (import the file with consumer subscriptions import)", r.Config)
	}
	if _, err := r.needKeyring(); err != nil {
		return consumer.Config{}, err
	}
	return consumer.Config{
		Breaker: breaker.Settings{ConsecutiveFailures: r.BreakerFailures, FailureRatio: r.BreakerFailureRatio, MinRequests: r.BreakerMinRequests,
			OpenTimeout: r.BreakerOpenTimeout},
		Stream: g.Stream, DLQStream: g.DLQStream, Replicas: r.StreamReplicas, StartupTimeout: r.StartupTimeout,
		Logger: log, Registerer: reg,
		// Validate needs a source; openKV sets the real one.
		SubscriptionStore: &consumer.SubscriptionStore{},
	}, nil
}

// openKV opens the subscriptions bucket (created when missing, waited for
// with w) into cfg when the subscriptions come from it.
func (r *runCmd) openKV(ctx context.Context, w *startup.Waiter, js jetstream.JetStream, cfg *consumer.Config) error {
	if r.SubscriptionsFrom != "kv" {
		return nil
	}
	keys, err := r.needKeyring()
	if err != nil {
		return err
	}
	scfg, err := r.storeConfig(keys)
	if err != nil {
		return err
	}
	return w.For(ctx, "JetStream key-value bucket "+r.Bucket, func(ctx context.Context) error {
		s, err := consumer.OpenSubscriptionStore(ctx, js, scfg)
		if err != nil {
			return startup.JetStreamErr(err)
		}
		cfg.SubscriptionStore = s
		return nil
	})
}

// staticConfig is, for a command that needs the subscriptions once (dlq
// replay), the configuration of fromFlags, or with --subscriptions-from
// kv one holding every subscription of the bucket (paused ones too),
// opened with the secrets key.
func (f *kvFlags) staticConfig(ctx context.Context, g *Globals, js jetstream.JetStream, log *slog.Logger, fromFlags func() (consumer.Config, error)) (consumer.Config, error) {
	if f.SubscriptionsFrom != "kv" {
		return fromFlags()
	}
	keys, err := f.needKeyring()
	if err != nil {
		return consumer.Config{}, err
	}
	scfg, err := f.storeConfig(keys)
	if err != nil {
		return consumer.Config{}, err
	}
	store, err := consumer.OpenSubscriptionStore(ctx, js, scfg)
	if err != nil {
		return consumer.Config{}, err
	}
	stored, err := store.List(ctx)
	if err != nil {
		return consumer.Config{}, err
	}
	if len(stored) == 0 {
		return consumer.Config{}, fmt.Errorf("subscriptions bucket %s holds no subscription", store.Bucket())
	}
	subs := make([]consumer.Subscription, len(stored))
	for i, s := range stored {
		subs[i] = s.Subscription
	}
	return consumer.Config{Subscriptions: subs, Stream: g.Stream, DLQStream: g.DLQStream, Logger: log}, nil
}
