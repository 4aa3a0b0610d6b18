package unordered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/breaker"
	"github.com/jsbridge/jsbridge/internal/backoff"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/pull"
)

// probeWait bounds one fetch of a half-open probe message.
const probeWait = 2 * time.Second

// consumerCheckInterval is how often a pulling subscription asks JetStream
// whether its durable consumer still exists. A consumer deleted while a
// pull request waits ends the pull at once (409 Consumer Deleted); one
// deleted while the client was disconnected only makes the new pull
// requests go unanswered, which nats.go does not report.
const consumerCheckInterval = 10 * time.Second

// Run delivers until ctx ends: it creates the durable consumer (unless
// Provision did), then, while the subscription is enabled, pulls while
// the endpoint's breaker is closed, fetches one message at a time as a
// probe while it is half-open, and pulls nothing while it is open. When
// ctx ends it stops pulling, lets the deliveries in flight finish (each
// bounded by the subscription's Timeout), Naks the messages pulled but
// not started, and returns. Nothing JetStream answers ends it: errors
// are logged at warn level and retried after a pause growing from 0.5 s
// to 15 s (±20 %). Call Run once.
func (r *Runner) Run(ctx context.Context) {
	// Deliveries run on a context Run's cancellation does not reach: a POST
	// that started finishes, and its message is acked or Nak'd.
	dctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, r.sub.MaxInFlight)
	var pause backoff.Backoff
	cons := r.cons
	started := false
	for ctx.Err() == nil {
		if cons == nil {
			c, err := r.createConsumer(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				d := pause.Next()
				r.log.Warn("durable consumer not available yet; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
				sleep(ctx, r.clock, d)
				continue
			}
			cons = c
		}
		if !started {
			r.log.Info("subscription started", slog.Any("filter_subjects", r.sub.FilterSubjects), slog.Int("max_in_flight", r.sub.MaxInFlight))
			started = true
		}
		if err := r.health.WaitEnabled(ctx, r.sub.Name); err != nil {
			return
		}
		if err := r.br.Wait(ctx); err != nil {
			return
		}
		began := r.clock.Now()
		var err error
		if r.br.State() == breaker.HalfOpen {
			err = r.probe(ctx, dctx, cons)
		} else {
			err = r.pull(ctx, dctx, cons, slots, &wg)
		}
		if err == nil || ctx.Err() != nil {
			pause.Reset()
			continue
		}
		if pull.ConsumerGone(err) {
			cons = nil
		}
		// A pull that went well for a while starts the pauses over.
		if r.clock.Since(began) > backoff.DefaultMax {
			pause.Reset()
		}
		d := pause.Next()
		r.log.Warn("pulling from JetStream failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d.Round(time.Millisecond)))
		sleep(ctx, r.clock, d)
	}
}

// probe fetches at most one message and delivers it while the breaker is
// half-open, so a probe spends one delivery attempt, not a buffer's worth.
// Finding no message is the normal case of an idle subscription (nats.go
// reports it as a timeout): the breaker stays half-open and run probes
// again. Any other error is returned for run to log and retry.
func (r *Runner) probe(ctx, dctx context.Context, cons jetstream.Consumer) error {
	fctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	msg, err := cons.Next(jetstream.FetchContext(fctx))
	switch {
	case err == nil:
		r.handle(dctx, ctx, msg)
		return nil
	case ctx.Err() != nil, errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, jetstream.ErrNoMessages), errors.Is(err, jetstream.ErrNoHeartbeat):
		return nil
	default:
		return fmt.Errorf("deliver: subscription %q: fetch probe message: %w", r.sub.Name, err)
	}
}

// pull consumes with a client buffer of MaxInFlight messages and up to
// MaxInFlight concurrent deliveries, until ctx ends, the breaker leaves
// closed or the subscription is disabled. Then it stops pulling and Naks what was buffered but not started:
// with the open timeout as delay when the breaker opened, at once on
// shutdown (another replica may take it) or a disable (the enable sends it).
func (r *Runner) pull(ctx, dctx context.Context, cons jetstream.Consumer, slots chan struct{}, wg *sync.WaitGroup) error {
	iter, err := cons.Messages(r.pullOptions()...)
	if err != nil {
		return fmt.Errorf("deliver: subscription %q: consume: %w", r.sub.Name, err)
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var gone atomic.Bool
	go func() {
		if r.census != nil {
			if r.census.WatchGone(pctx, r.sub.Name, cons) {
				gone.Store(true)
				stop()
			}
			return
		}
		t := r.clock.NewTicker(consumerCheckInterval)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.Chan():
			}
			// Only "not found" counts: during an election or an outage
			// the lookup fails otherwise, and pulling resumes by itself.
			if _, err := cons.Info(pctx); errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				gone.Store(true)
				stop()
				return
			}
		}
	}()
	go func() {
		for {
			changed, health := r.br.Changed(), r.health.Changes()
			if r.br.State() != breaker.Closed || r.health.IsDisabled(r.sub.Name) {
				stop()
				return
			}
			select {
			case <-pctx.Done():
				return
			case <-changed:
			case <-health:
			}
		}
	}()

	var result error
	for result == nil {
		select {
		case slots <- struct{}{}:
		case <-pctx.Done():
		}
		if pctx.Err() != nil {
			break
		}
		msg, err := iter.Next(jetstream.NextContext(pctx))
		if err != nil {
			<-slots
			if pctx.Err() != nil {
				break
			}
			result = fmt.Errorf("deliver: subscription %q: next message: %w", r.sub.Name, err)
			break
		}
		// One slot per delivery, whatever its stream: ordering none sends
		// a stream's events in parallel too, up to MaxInFlight here and
		// MaxAckPending across the replicas.
		wg.Add(1)
		r.workers.Run(func() {
			defer wg.Done()
			defer func() { <-slots }()
			r.handle(dctx, ctx, msg)
		})
	}

	if result == nil && gone.Load() && ctx.Err() == nil {
		result = fmt.Errorf("deliver: subscription %q on JetStream stream %q: %w", r.sub.Name, r.stream, pull.ErrConsumerGone)
	}
	// Back at once unless the breaker opened: on shutdown another replica
	// may take them; when the subscription was disabled, the enable sends
	// them, and an open-timeout delay would hold them past it.
	delay := time.Duration(0)
	if ctx.Err() == nil && result == nil && r.br.State() != breaker.Closed {
		delay = r.br.OpenTimeout()
	}
	iter.Drain()
	for {
		msg, err := iter.Next(jetstream.NextMaxWait(time.Second))
		if err != nil {
			break
		}
		log := r.log.With(slog.String("event_id", attempt.EventID(msg)))
		log.Debug("stopped pulling, returning buffered message", slog.Duration("delay", delay))
		pull.Nak(log, msg, delay)
	}
	iter.Stop()
	return result
}
