package shared

import (
	"context"
	"log/slog"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
)

// The endpoints' circuit breakers (package breaker, one per endpoint,
// shared by the subscriptions that post to it and, with a breaker store,
// by the replicas; docs/failing-endpoints.md). While an endpoint's
// breaker is open its subscriptions get a cursor in fanout.StateBreaker
// on every partition the replica owns, and on those it claims meanwhile
// (docs/design/next-engine.md, section 3: no reads, nothing held back,
// the floor passes them); their attempts already in hand wait for the breaker
// unsent (attempt.Claim.Attempt waits for it). Once its open timeout passed
// (half-open, a probe free) or it closed, the cursors go back to
// reading (SetState("")): the first attempt through is the probe, as the
// durables engine's one-message probe; a failed probe opens the breaker
// again and the cursors go back to StateBreaker, a successful one closes
// it and the subscriptions catch up from their cursors and rejoin. A
// paused or disabled subscription keeps that state, and a resume or an
// enable finds its endpoint's breaker open (cursorState).

// watchBreakers starts the watch of every endpoint of the subscriptions
// given so far, and of those put later, until ctx ends (Start).
func (r *Replica) watchBreakers(ctx context.Context) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	r.subs.bctx, r.subs.watched = ctx, map[string]bool{}
	for _, s := range r.subs.given {
		r.watchBreaker(s.URL)
	}
}

// watchBreaker starts the watch of url's endpoint breaker unless it runs
// (or the replica has not started). r.subs.mu is held.
func (r *Replica) watchBreaker(url string) {
	ep := breaker.Endpoint(url)
	if r.subs.bctx == nil || r.subs.watched[ep] {
		return
	}
	r.subs.watched[ep] = true
	br, ctx := r.subs.breakers.Breaker(url), r.subs.bctx
	r.bg.Go(func() { r.followBreaker(ctx, ep, br) })
}

// followBreaker applies breaker br's state to the subscriptions of
// endpoint ep: open (not Ready) → their cursors in StateBreaker; then,
// when Wait lets a call through (half-open with a probe free, or
// closed) → reading again; until ctx ends.
func (r *Replica) followBreaker(ctx context.Context, ep string, br *breaker.Breaker) {
	for {
		changed := br.Changed()
		if !br.Ready() {
			r.setBreakerOpen(ep, true)
			if br.Wait(ctx) != nil {
				return
			}
			r.setBreakerOpen(ep, false)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// setBreakerOpen records whether endpoint ep's breaker is open and
// applies it to every fan-out running.
func (r *Replica) setBreakerOpen(ep string, open bool) {
	r.subs.mu.Lock()
	defer r.subs.mu.Unlock()
	if r.subs.opened[ep] == open {
		return
	}
	r.subs.opened[ep] = open
	r.log.Info("shared: the endpoint's circuit breaker changed: its subscriptions' cursors follow", slog.String("endpoint", ep), slog.Bool("open", open))
	for fan := range r.subs.fans {
		r.applyBreakers(fan)
	}
	r.poke()
}

// applyBreakers gives each subscription whose endpoint's breaker is open
// a cursor in StateBreaker on fan, and sets a StateBreaker cursor of one
// whose breaker let calls through again back to reading (a former
// owner's too, claimed here); a paused or disabled one is left as it
// is. r.subs.mu is held.
func (r *Replica) applyBreakers(fan *fanout.Partition) {
	behind := fan.Behind()
	for name, s := range r.subs.given {
		if r.subs.paused[name] || r.health.IsDisabled(name) {
			continue
		}
		open, st := r.subs.opened[breaker.Endpoint(s.URL)], behind[name]
		var to string
		switch {
		case open && st != fanout.StateBreaker:
			to = fanout.StateBreaker
		case !open && st == fanout.StateBreaker:
			to = ""
		default:
			continue
		}
		if err := fan.SetState(name, to); err != nil {
			r.log.Warn("shared: apply the endpoint's circuit breaker", slog.String("subscription", name),
				slog.String("state", to), slog.Any("error", err))
		}
	}
}

// cursorState is the state a subscription resumed or enabled goes to:
// StateBreaker while its endpoint's breaker is open, else reading ("").
// r.subs.mu is held.
func (r *Replica) cursorState(name string) string {
	if s, ok := r.subs.given[name]; ok && r.subs.opened[breaker.Endpoint(s.URL)] {
		return fanout.StateBreaker
	}
	return ""
}
