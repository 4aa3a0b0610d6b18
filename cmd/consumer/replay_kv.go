package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/consumer"
)

// kvConfig is, with --subscriptions-from kv, the configuration replay
// sends with: the one subscription of the bucket it replays to
// (--subscription, or the bucket's only one), opened with the secrets
// key. Only that subscription is read and validated, so
// a subscription this machine cannot open (its TLS files elsewhere) does
// not stop the replay of another.
func (c *replayCmd) kvConfig(ctx context.Context, g *Globals, js jetstream.JetStream, log *slog.Logger) (consumer.Config, error) {
	if c.Config != "" {
		return consumer.Config{}, fmt.Errorf("--config %s with --subscriptions-from kv: give one source of subscriptions", c.Config)
	}
	keys, err := c.needKeyring()
	if err != nil {
		return consumer.Config{}, err
	}
	scfg, err := c.storeConfig(keys)
	if err != nil {
		return consumer.Config{}, err
	}
	store, err := consumer.OpenSubscriptionStore(ctx, js, scfg)
	if err != nil {
		return consumer.Config{}, err
	}
	var sub consumer.StoredSubscription
	if c.Subscription != "" {
		sub, err = store.Get(ctx, c.Subscription)
		if errors.Is(err, consumer.ErrSubscriptionNotFound) {
			return consumer.Config{}, fmt.Errorf("--subscription %q: no such subscription in bucket %s: %w", c.Subscription, store.Bucket(), err)
		}
		if err != nil {
			return consumer.Config{}, err
		}
	} else {
		stored, err := store.List(ctx)
		if err != nil {
			return consumer.Config{}, err
		}
		if len(stored) != 1 {
			names := make([]string, len(stored))
			for i, s := range stored {
				names[i] = s.Name
			}
			return consumer.Config{}, fmt.Errorf("--subscription is required: bucket %s holds %d subscriptions (%q)", store.Bucket(), len(stored), names)
		}
		sub = stored[0]
	}
	return consumer.Config{Subscriptions: []consumer.Subscription{sub.Subscription}, Stream: g.Stream, DLQStream: g.DLQStream, Logger: log}, nil
}
