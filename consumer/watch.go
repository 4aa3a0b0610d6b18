package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/subkv"
)

// watch applies the changes of Config.SubscriptionStore's bucket to the
// fleet until ctx ends: a subscription put and not paused runs (started,
// updated in place or restarted, deliver.Fleet.Put), a paused one stops
// with its position kept, a deleted one stops and its durable consumers
// are deleted. A document this replica cannot read (sealed with a key it
// does not hold, a later layout) is logged at error level and what ran
// for it keeps running. A failed watch is retried with backoff; each new
// watch replays the bucket, and subscriptions running here that it no
// longer holds (deleted meanwhile) are removed.
func (c *Consumer) watch(ctx context.Context) {
	store := c.cfg.SubscriptionStore.s
	log := c.cfg.Logger
	var pause backoff.Backoff
	for ctx.Err() == nil {
		seen := map[string]bool{}
		began := time.Now()
		err := store.Watch(ctx, func(ch subkv.Change) {
			c.apply(ctx, log, ch, seen)
		})
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > backoff.DefaultMax {
			pause.Reset()
		}
		d := pause.Next()
		log.Warn("watching the subscriptions bucket failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// apply applies one change of the bucket; seen collects the names of the
// watch's initial replay.
func (c *Consumer) apply(ctx context.Context, log *slog.Logger, ch subkv.Change, seen map[string]bool) {
	if ch.Name == "" { // the end of the initial replay
		for _, name := range c.fleet.Names() {
			if !seen[name] {
				c.remove(ctx, log, name)
			}
		}
		return
	}
	if ch.Initial {
		seen[ch.Name] = true
	}
	l := log.With(slog.String("subscription", ch.Name))
	switch {
	case ch.Deleted && ch.Initial && !slices.Contains(c.fleet.Names(), ch.Name):
		// Deleted before this watch began, and not running here.
	case ch.Deleted:
		c.remove(ctx, log, ch.Name)
	case ch.Err != nil:
		l.Error("subscription in the bucket cannot be read: what runs for it keeps running", slog.Any("error", ch.Err))
	case ch.Entry.Paused:
		c.fleet.Pause(ch.Name)
	default:
		s := fromEngine(ch.Entry.Subscription)
		if err := s.Validate(); err != nil {
			l.Error("subscription in the bucket is invalid here: what runs for it keeps running", slog.Any("error", err))
			return
		}
		if err := c.fleet.Put(s.engine()); err != nil {
			l.Error("subscription cannot start: what runs for it keeps running", slog.Any("error", err))
		}
	}
}

// removeTimeout bounds the deletion of a removed subscription's durable
// consumers.
const removeTimeout = 15 * time.Second

// remove stops the subscription name and deletes its durable consumers.
func (c *Consumer) remove(ctx context.Context, log *slog.Logger, name string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	if err := c.fleet.Remove(rctx, name); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("deleting a removed subscription's durable consumers failed; delete them with nats consumer rm", slog.String("subscription", name), slog.Any("error", err))
	}
}
