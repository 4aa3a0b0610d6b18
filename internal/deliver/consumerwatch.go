package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/wire"
)

// consumerWatch reads a partition consumer's state every so often: its
// ack floor, whether it still exists, and how old its oldest unsettled
// event is against the copy's MaxAge.
type consumerWatch struct {
	cons    jetstream.Consumer
	durable string        // its name
	every   time.Duration // how often it is read (ordercopy.CheckEvery)
	clock   clockwork.Clock
	log     *slog.Logger
	filters []string // its filter subjects
	// copyStream returns the partitioned copy (checkRetention reads it).
	copyStream func(context.Context) (jetstream.Stream, error)
	release    func() // releases the partition

	// floor is the consumer's ack floor (stream sequence) as last read
	// (here, or by the partition's fence).
	floor atomic.Uint64
	// pulled counts the messages the partition pulled (its run loop
	// adds them): a read that found the consumer quiet is only repeated
	// at once when it moved.
	pulled atomic.Uint64
}

// quietReads is how many of watchConsumer's ticks make one read while
// the partition is quiet: its last read found nothing pending on the
// consumer (NumAckPending and NumPending 0) and nothing was pulled since,
// so the ack floor cannot have moved and nothing can age out of the copy.
// A read every tick, 1,600 idle partitions (100 ordered subscriptions)
// made 320 consumer info requests a second; a quiet one now reads every
// 12 ticks (60 s), which still finds a consumer deleted while it is idle.
const quietReads = 12

// watchConsumer reads the partition consumer's state every
// ordercopy.CheckEvery (every quietReads of them while the partition is
// quiet) until ctx ends: it records its ack floor (where a
// consumer deleted at run time is made again from, see ensureConsumer),
// releases the partition when the consumer is gone (the ownership loop
// makes it again and claims the partition anew), and reports an unsettled
// event about to age out of the copy (checkRetention).
func (cw *consumerWatch) watchConsumer(ctx context.Context) {
	var warned uint64
	quiet, seen, skipped := false, uint64(0), 0
	for ctx.Err() == nil {
		if quiet && cw.pulled.Load() == seen && skipped < quietReads-1 {
			skipped++
			select {
			case <-ctx.Done():
			case <-cw.clock.After(cw.every):
			}
			continue
		}
		skipped, seen = 0, cw.pulled.Load()
		ictx, cancel := context.WithTimeout(ctx, kvTimeout)
		info, err := cw.cons.Info(ictx)
		quiet = false
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
			cancel()
			cw.log.Warn("the partition consumer no longer exists; releasing the partition to create it again",
				slog.String("durable", cw.durable), slog.Uint64("ack_floor", cw.floor.Load()))
			cw.release()
			return
		case err == nil:
			cw.floor.Store(info.AckFloor.Stream)
			warned = cw.checkRetention(ictx, info.AckFloor.Stream, warned)
			quiet = info.NumAckPending == 0 && info.NumPending == 0
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-cw.clock.After(cw.every):
		}
	}
}

// checkRetention logs an error when the partition's oldest unsettled event
// (its consumer's first message after the ack floor) is older than
// ordercopy.RetentionWarn quarters of the copy's MaxAge: held behind a parked head,
// or not delivered yet, it is removed from the copy at MaxAge and never
// delivered. warned is the sequence already reported (once each); it
// returns the one reported now, or warned.
func (cw *consumerWatch) checkRetention(ctx context.Context, floor, warned uint64) uint64 {
	s, err := cw.copyStream(ctx)
	if err != nil {
		return warned
	}
	maxAge := s.CachedInfo().Config.MaxAge
	if maxAge <= 0 {
		return warned
	}
	var oldest *jetstream.RawStreamMsg
	for _, f := range cw.filters {
		m, err := s.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(f))
		if err == nil && (oldest == nil || m.Sequence < oldest.Sequence) {
			oldest = m
		}
	}
	if oldest == nil || oldest.Sequence == warned {
		return warned
	}
	age := cw.clock.Since(oldest.Time)
	if age < maxAge/4*ordercopy.RetentionWarn {
		return warned
	}
	cw.log.Error(fmt.Sprintf("an event of the partition is not settled after 3/4 of the partitioned copy's MaxAge: the copy removes it at MaxAge, "+
		"and it is then never delivered to this subscription. If its stream is parked, replay or skip its head (consumer dlq); "+
		"raise the copy's retention with: nats stream edit %s --max-age", s.CachedInfo().Config.Name),
		slog.String("event_id", oldest.Header.Get(wire.HeaderMsgID)), slog.Uint64("seq", oldest.Sequence),
		slog.String("stream_key", wire.StreamKey(oldest.Subject)), slog.Duration("age", age.Round(time.Millisecond)), slog.Duration("max_age", maxAge))
	return oldest.Sequence
}
