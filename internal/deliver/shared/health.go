package shared

import (
	"context"
	"log/slog"
	"time"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
)

// healthLoadTimeout bounds Start's first read of the disabled
// subscriptions (health.State.Load); past it the watch catches up.
const healthLoadTimeout = 5 * time.Second

// The subscriptions' health, as the old engine keeps it (package health,
// docs/failing-endpoints.md): every attempt feeds the subscription's
// health.State (attempt.Deps.Health), so a 410 Gone, or failures without
// a success for health.Config.DisableAfter, disable the subscription in
// the health bucket, and the replica that disables it announces it (the
// ops.endpoint.disabled event, the operational webhook). Every replica
// follows the bucket (health.State.Start) and gives a disabled
// subscription a cursor in fanout.StateDisabled on every partition it
// owns (docs/design/next-engine.md, section 3: no reads, nothing held
// back); enabling it (`consumer subscriptions enable`) sets the cursors
// back to reading (SetState("")), and the subscription catches up and
// rejoins. A partition claimed later starts with its disabled
// subscriptions disabled. Meanwhile an attempt already in hand waits
// unsent (attempt.Sender.Gate) until the subscription is enabled or the
// partition released.

// watchHealth applies the health to every fan-out running, then again
// at each change of the health bucket's disabled keys, until ctx ends.
// A fan-out started meanwhile had it applied at its start (startFan).
func (r *Replica) watchHealth(ctx context.Context) {
	for {
		changed := r.health.Changes()
		r.subs.mu.Lock()
		for fan := range r.subs.fans {
			r.applyHealth(fan)
		}
		r.subs.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// applyHealth gives each disabled subscription a cursor in
// StateDisabled on fan, and sets a cursor in StateDisabled of an enabled
// one back to reading. A paused subscription is left paused: a pause and
// a disable both stop it, and a resume finds it disabled
// (pauseOrResume). r.subs.mu is held.
func (r *Replica) applyHealth(fan *fanout.Partition) {
	behind := fan.Behind()
	for name := range r.subs.given {
		var to string
		switch disabled, st := r.health.IsDisabled(name), behind[name]; {
		case r.subs.paused[name]:
			continue
		case disabled && st != fanout.StateDisabled:
			to = fanout.StateDisabled
		case !disabled && st == fanout.StateDisabled:
			to = r.cursorState(name) // its endpoint's breaker may be open
		default:
			continue
		}
		if err := fan.SetState(name, to); err != nil {
			r.log.Warn("shared: apply the subscription's health", slog.String("subscription", name),
				slog.String("state", to), slog.Any("error", err))
		}
	}
}

// Disabled reports whether subscription name is disabled, as this
// replica follows the health bucket.
func (r *Replica) Disabled(name string) bool { return r.health.IsDisabled(name) }
