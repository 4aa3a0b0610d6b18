package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/subkv"
	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// liveSubscriptions is an engine whose subscriptions change while it
// runs: the subscriptions bucket's changes are applied to it (watch).
// Put, Pause and Remove are safe for concurrent use, and while it runs.
type liveSubscriptions interface {
	// Put makes s, created at created (its document's time), delivered:
	// started, updated in place or restarted; resumed when it was paused.
	Put(s subscription.Subscription, created time.Time) error
	// Pause stops delivering s, keeping its position.
	Pause(s subscription.Subscription, created time.Time)
	// Remove stops delivering subscription name and deletes its position
	// (its cursors).
	Remove(ctx context.Context, name string) error
	// Deleted is told of subscription name, which does not run here,
	// deleted from the bucket before this watch began (its delete
	// marker): the engine drops what the partitions it claims hold of
	// it (fanout.StateHeld) instead of holding it.
	Deleted(ctx context.Context, name string)
	// Names are the subscriptions it has, sorted.
	Names() []string
	// Loaded is called at the end of each watch's initial replay, once
	// the bucket's subscriptions were submitted.
	Loaded()
}

// watch applies the changes of Config.SubscriptionStore's bucket to the
// engine (c.live) until ctx ends: a subscription put and not paused runs
// (started, updated in place or restarted: shared.Replica.PutAt), a
// paused one stops with its position kept, a deleted one stops and its
// position is deleted (its cursors). Changes of one subscription are applied in order, the
// latest winning when several arrived while one was applied; changes of
// different subscriptions are applied at once, so one slow to stop (its
// in-flight deliveries finish first) holds up no other. A document this
// replica cannot read (sealed with a key it does not hold, a later layout)
// is logged at error level and what ran for it keeps running. A failed
// watch is retried with backoff; each new watch replays the bucket, and
// subscriptions running here that it no longer holds (deleted meanwhile)
// are removed.
func (c *Consumer) watch(ctx context.Context) {
	store := c.cfg.SubscriptionStore.s
	log, clock := c.arch.Logger, c.arch.Clock
	a := &applier{fleet: c.live, log: log, pending: map[string]subkv.Change{}, busy: map[string]bool{}}
	defer a.wg.Wait()
	var pause backoff.Backoff
	for ctx.Err() == nil {
		seen := map[string]bool{}
		began := clock.Now()
		err := store.Watch(ctx, func(ch subkv.Change) {
			if ch.Name == "" { // the end of the initial replay
				for _, name := range c.live.Names() {
					if !seen[name] {
						a.submit(ctx, subkv.Change{Name: name, Deleted: true})
					}
				}
				// Not in this callback: the watch goes on meanwhile.
				a.wg.Go(func() { a.wait(ctx); c.live.Loaded() }) // joined as the watch ends
				return
			}
			if ch.Initial {
				seen[ch.Name] = true
			}
			a.submit(ctx, ch)
		})
		if ctx.Err() != nil {
			return
		}
		if clock.Since(began) > backoff.DefaultMax {
			pause.Reset()
		}
		d := pause.Next()
		log.Warn("watching the subscriptions bucket failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		select {
		case <-ctx.Done():
		case <-clock.After(d):
		}
	}
}

// applier applies the bucket's changes to the engine, one goroutine per
// subscription with changes pending: each change is the whole new state
// (a document, or deleted), so only the latest pending one matters.
type applier struct {
	fleet liveSubscriptions
	log   *slog.Logger

	mu      sync.Mutex
	pending map[string]subkv.Change // the latest change not applied yet
	busy    map[string]bool         // a goroutine applies this name's changes
	idle    chan struct{}           // closed when busy empties; made again when it fills
	wg      sync.WaitGroup

	ackWaitWarned sync.Map // subscription names warned of their ignored ack_wait
}

// wait returns once no change waits to be applied, or ctx ended.
func (a *applier) wait(ctx context.Context) {
	a.mu.Lock()
	if len(a.busy) == 0 {
		a.mu.Unlock()
		return
	}
	idle := a.idle
	a.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-idle:
	}
}

// submit queues ch and starts its subscription's goroutine unless it runs.
func (a *applier) submit(ctx context.Context, ch subkv.Change) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending[ch.Name] = ch
	if a.busy[ch.Name] {
		return
	}
	name := ch.Name
	if len(a.busy) == 0 {
		a.idle = make(chan struct{})
	}
	a.busy[name] = true
	a.wg.Go(func() {
		for {
			a.mu.Lock()
			ch, ok := a.pending[name]
			delete(a.pending, name)
			if !ok {
				delete(a.busy, name)
				if len(a.busy) == 0 {
					close(a.idle)
				}
			}
			a.mu.Unlock()
			if !ok {
				return
			}
			a.apply(ctx, ch)
		}
	})
}

// apply applies one change.
func (a *applier) apply(ctx context.Context, ch subkv.Change) {
	l := a.log.With(slog.String("subscription", ch.Name))
	if !ch.Deleted && ch.Err == nil && ch.Entry.Subscription.AckWait != 0 {
		if _, warned := a.ackWaitWarned.LoadOrStore(ch.Name, true); !warned {
			// A document of an earlier release: loaded, its ack_wait ignored.
			l.Warn(subscription.AckWaitIgnored, slog.Duration("ack_wait", ch.Entry.Subscription.AckWait))
		}
	}
	switch {
	case ch.Deleted && ch.Initial && !slices.Contains(a.fleet.Names(), ch.Name):
		// Deleted before this watch began, and not running here.
		a.fleet.Deleted(ctx, ch.Name)
	case ch.Deleted:
		a.remove(ctx, l, ch.Name)
	case ch.Err != nil:
		l.Error("subscription in the bucket cannot be read: what runs for it keeps running", slog.Any("error", ch.Err))
	case ch.Entry.Paused:
		a.fleet.Pause(ch.Entry.Subscription, ch.Entry.Document.Created)
	default:
		s := subscriptionFromEngine(ch.Entry.Subscription)
		if err := s.Validate(); err != nil {
			l.Error("subscription in the bucket is invalid here: what runs for it keeps running", slog.Any("error", err))
			return
		}
		if err := a.fleet.Put(s.engine(), ch.Entry.Document.Created); err != nil {
			l.Error("subscription cannot start: what runs for it keeps running", slog.Any("error", err))
		}
	}
}

// removeTimeout bounds the deletion of a removed subscription's
// position and failure streak.
const removeTimeout = 15 * time.Second

// remove stops the subscription name and deletes its position and its
// failure streak.
func (a *applier) remove(ctx context.Context, log *slog.Logger, name string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	if err := a.fleet.Remove(rctx, name); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("deleting a removed subscription's failure streak failed", slog.Any("error", err))
	}
}
