package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// watchConsumer reads the partition consumer's state every
// copyCheckEvery until ctx ends: it records its ack floor (where a
// consumer deleted at run time is made again from, see ensureConsumer),
// releases the partition when the consumer is gone (the ownership loop
// makes it again and claims the partition anew), and reports an unsettled
// event about to age out of the copy (checkRetention).
func (pt *partition) watchConsumer(ctx context.Context, every time.Duration) {
	var warned uint64
	for ctx.Err() == nil {
		ictx, cancel := context.WithTimeout(ctx, kvTimeout)
		info, err := pt.cons.Info(ictx)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
			cancel()
			pt.log.Warn("the partition consumer no longer exists; releasing the partition to create it again",
				slog.String("durable", wire.PartitionDurable(pt.r.sub.Name, pt.p)), slog.Uint64("ack_floor", pt.floor.Load()))
			pt.release()
			return
		case err == nil:
			pt.floor.Store(info.AckFloor.Stream)
			warned = pt.checkRetention(ictx, info.AckFloor.Stream, warned)
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-pt.clock.After(every):
		}
	}
}

// checkRetention logs an error when the partition's oldest unsettled event
// (its consumer's first message after the ack floor) is older than
// retentionWarn quarters of the copy's MaxAge: held behind a parked head,
// or not delivered yet, it is removed from the copy at MaxAge and never
// delivered. warned is the sequence already reported (once each); it
// returns the one reported now, or warned.
func (pt *partition) checkRetention(ctx context.Context, floor, warned uint64) uint64 {
	s, err := pt.or.copyStream(ctx)
	if err != nil {
		return warned
	}
	maxAge := s.CachedInfo().Config.MaxAge
	if maxAge <= 0 {
		return warned
	}
	var oldest *jetstream.RawStreamMsg
	for _, f := range pt.filters {
		m, err := s.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(f))
		if err == nil && (oldest == nil || m.Sequence < oldest.Sequence) {
			oldest = m
		}
	}
	if oldest == nil || oldest.Sequence == warned {
		return warned
	}
	age := pt.clock.Since(oldest.Time)
	if age < maxAge/4*retentionWarn {
		return warned
	}
	pt.log.Error(fmt.Sprintf("an event of the partition is not settled after 3/4 of the partitioned copy's MaxAge: the copy removes it at MaxAge, "+
		"and it is then never delivered to this subscription. If its stream is parked, replay or skip its head (consumer dlq); "+
		"raise the copy's retention with: nats stream edit %s --max-age", s.CachedInfo().Config.Name),
		slog.String("event_id", oldest.Header.Get(wire.HeaderMsgID)), slog.Uint64("seq", oldest.Sequence),
		slog.String("stream_key", wire.StreamKey(oldest.Subject)), slog.Duration("age", age.Round(time.Millisecond)), slog.Duration("max_age", maxAge))
	return oldest.Sequence
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
