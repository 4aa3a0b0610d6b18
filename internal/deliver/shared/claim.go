package shared

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared/metrics"
)

// gained is the owner's Callbacks.Gained: it must not block, so the
// claim is served by a goroutine of its own.
func (r *Replica) gained(c *owner.Claim) {
	r.claims.Go(func() { r.serve(c) }) // joined by run before it stops the other parts
}

// serve runs partition c.Partition for as long as the claim lasts
// (docs/design/next-engine.md, "What a new owner does"): it claims the
// record under the claim's epoch and runs its commits, makes the
// fan-out, and has the dispatch loop take the partition from the
// record's floor. Once the claim's context ends (released, lost, the
// replica stopping), or a commit finds the record claimed by another
// owner (position.ErrLost: the claim is lost, Claim.Lose), it has the
// loop release the partition, closes the fan-out, stops the commits
// (they commit what is left) and tells the owner Done, which deletes the
// lease so that the next owner claims at once.
func (r *Replica) serve(c *owner.Claim) {
	defer c.Done()
	ctx := c.Context()
	arch := r.cfg.Archetype.With(slog.Int("partition", c.Partition), slog.Uint64("epoch", c.Epoch))
	log := arch.Logger
	pos, err := position.Claim(ctx, r.js, r.metrics.KV(r.poskv), position.Config{Archetype: arch, Partition: c.Partition, Owner: r.cfg.Replica,
		Epoch: c.Epoch, Created: r.created, Linger: r.cfg.Linger})
	if err != nil {
		if errors.Is(err, position.ErrLost) {
			c.Lose()
		}
		log.Warn("shared: claim the partition's record", slog.Any("error", err))
		r.metrics.Handover(false, metrics.CauseClaimError)
		return
	}
	r.metrics.Handover(true, metrics.CauseClaimed)
	_ = pos.Start(ctx) // the commits outlive the claim's context: Stop ends them
	defer pos.Stop()

	send := attempt.NewClaim(attempt.ClaimConfig{Archetype: arch, StuckAfter: r.cfg.OrderStuckAfter},
		attempt.ClaimDeps{Senders: r.senders, Claim: c, Epochs: r.epochs, Letters: r.letters, DeadLettered: r.dead, Breakers: r.subs.breakers, Skipped: r.poskv})
	fan := fanout.New(fanout.Config{Archetype: arch, Partition: c.Partition, Epoch: c.Epoch, Requests: r.requests,
		Deleted: r.deleted, Wake: r.loop.poke},
		r.members, pos, send, r.chain, r.cursors)
	r.startFan(c.Partition, fan, pos)
	floor := pos.Record().Floor
	var runErr error
	ended := false
	if err := r.loop.take(ctx, c.Partition, floor, fan); err != nil {
		if ctx.Err() == nil {
			log.Warn("shared: take the partition", slog.Any("error", err))
		}
	} else {
		log.Debug("shared: partition taken", slog.Uint64("floor", floor))
		r.mu.Lock()
		r.parts[c.Partition] = served{epoch: c.Epoch, fan: fan}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-pos.Stopped():
			runErr, ended = pos.Err(), true
			c.Lose() // Run ends on its own only with ErrLost
		}
	}
	r.mu.Lock()
	if r.parts[c.Partition].fan == fan {
		delete(r.parts, c.Partition)
	}
	r.mu.Unlock()
	r.loop.release(c.Partition, fan)
	r.endFan(fan)
	for sub := range fan.Behind() {
		r.cursors.Drop(sub, c.Partition)
	}
	fan.Close()
	pos.Stop()
	if !ended {
		runErr = pos.Err()
	}
	if runErr != nil {
		log.Warn("shared: the partition's commits ended", slog.Any("error", runErr))
	}
	r.metrics.Handover(false, metrics.ReleaseCause(ctx, ended && errors.Is(runErr, position.ErrLost)))
	log.Debug("shared: partition released", slog.Uint64("floor", fan.Floor()), slog.Any("cause", context.Cause(ctx)))
}
