package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/wire"
)

// copyStream returns the partitioned stream, looked up once.
func (or *orderedRunner) copyStream(ctx context.Context) (jetstream.Stream, error) {
	or.streamMu.Lock()
	defer or.streamMu.Unlock()
	if or.stream != nil {
		return or.stream, nil
	}
	s, err := or.r.js.Stream(ctx, or.o.stream())
	if err != nil {
		return nil, err
	}
	or.stream = s
	return s, nil
}

// ensureConsumer makes partition p's consumer again when it was deleted:
// from the sequence after floor (its last known ack floor; what it had
// delivered past that comes again, at least once), from where it was
// created at first when floor is 0. A consumer another replica made
// meanwhile is used as it is.
func (or *orderedRunner) ensureConsumer(ctx context.Context, o *ordering, p int, floor uint64) {
	_, err := or.cons[p].Info(ctx)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return
	}
	cfg, err := or.consumerConfig(o, p)
	if err != nil {
		return // createConsumers made it from the same config
	}
	cfg.Replicas = or.replicas
	keepStart(&cfg, or.created[p])
	if floor > 0 {
		// What it delivered before floor+1 is still the subscription's:
		// the version chain looks predecessors up from where it first
		// started.
		recordChainFrom(&cfg, chainStart(or.created[p]))
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = floor + 1
	}
	c, err := o.js.CreateConsumer(ctx, o.stream(), cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		c, err = o.js.Consumer(ctx, o.stream(), cfg.Durable)
	}
	if err != nil {
		or.r.log.Warn("creating a deleted partition consumer again failed; retrying when the partition is claimed",
			slog.Int("partition", p), slog.String("durable", cfg.Durable), slog.Any("error", err))
		return
	}
	or.cons[p] = c
	or.r.log.Warn("a partition consumer was deleted; created it again after its last known ack floor (what it delivered after that comes again)",
		slog.Int("partition", p), slog.String("durable", cfg.Durable), slog.Uint64("start_seq", floor+1))
}

// createConsumers creates or updates the partition consumers. Existing
// ones keep their start and position (ErrStartChanged when the
// subscription's start differs from the one they record); missing ones
// start where an existing one did, else at the subscription's start (see
// startSeq), the same copy sequence for every partition.
func (or *orderedRunner) createConsumers(ctx context.Context, o *ordering, replicas int) error {
	js := o.js
	or.replicas = replicas
	sub := or.r.sub
	cfgs := make([]jetstream.ConsumerConfig, len(or.cons))
	found := make([]bool, len(or.cons))
	var model *jetstream.ConsumerConfig // an existing partition consumer's
	for p := range or.cons {
		cfg, err := or.consumerConfig(o, p)
		if err != nil {
			return fmt.Errorf("deliver: %w %q: %w", subscription.ErrInvalidSubscription, sub.Name, err)
		}
		existing, err := js.Consumer(ctx, o.stream(), cfg.Durable)
		switch {
		case err == nil:
			have := existing.CachedInfo().Config
			if err := subscription.CheckStart(sub.Name, sub.Start, have, cfg.Durable, o.stream(), or.resetHint(o)); err != nil {
				return err
			}
			cfg.Replicas = have.Replicas
			keepStart(&cfg, have)
			if model == nil {
				model = &have
			}
			found[p] = true
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			cfg.Replicas = replicas
		default:
			return fmt.Errorf("deliver: subscription %q: look up durable consumer %q on JetStream stream %q: %w", sub.Name, cfg.Durable, o.stream(), err)
		}
		cfgs[p] = cfg
	}
	if model != nil {
		or.r.log.Info("partition consumers exist: they keep their start and position", slog.String("start", subscription.ReportedStart(*model)))
	}
	var startSeq uint64
	if model == nil && slices.Contains(found, false) {
		var err error
		if startSeq, err = or.startSeq(ctx, o); err != nil {
			return err
		}
		or.r.log.Info("partition consumers created", slog.String("start", sub.Start.String()), slog.Uint64("copy_start_seq", startSeq))
	}
	for p, cfg := range cfgs {
		var c jetstream.Consumer
		var err error
		switch {
		case found[p]:
			c, err = js.CreateOrUpdateConsumer(ctx, o.stream(), cfg)
		default:
			if model != nil {
				keepStart(&cfg, *model)
			} else {
				subscription.RecordStart(&cfg, sub.Start)
				if startSeq > 0 {
					cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
				}
			}
			c, err = js.CreateConsumer(ctx, o.stream(), cfg)
			if errors.Is(err, jetstream.ErrConsumerExists) {
				// Another replica created it meanwhile: the partitions
				// still missing start where it started this one.
				if c, err = js.Consumer(ctx, o.stream(), cfg.Durable); err == nil {
					have := c.CachedInfo().Config
					model = &have
				}
			}
		}
		if err != nil {
			return fmt.Errorf("deliver: subscription %q: create or update durable consumer %q on JetStream stream %q: %w", sub.Name, cfg.Durable, o.stream(), err)
		}
		or.cons[p] = c
		or.created[p] = c.CachedInfo().Config
	}
	return nil
}

// resetHint is the shell command that deletes the subscription's
// partition consumers.
func (or *orderedRunner) resetHint(o *ordering) string {
	durable := strings.TrimSuffix(wire.PartitionDurable(or.r.sub.Name, 0), "0") + "$p"
	return fmt.Sprintf("for p in $(seq 0 %d); do nats consumer rm -f %s %s; done", len(or.cons)-1, o.stream(), durable)
}

// step renews, releases or claims partition p. want says whether p is this
// replica's share; unknown that membership could not be read (then nothing
