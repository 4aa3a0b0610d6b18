package deliver

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// failedAttempts counts the failed POSTs of an ordered subscription's
// events across owners, so that MaxDeliver bounds real attempts and
// nothing else: JetStream's delivery count also counts every Nak at a
// hand-over and every AckWait expiry of a message waiting in a reader's
// buffer. An event's count is a key of the park bucket
// (wire.AttemptsKey), written only after a failed attempt and deleted
// when the event settles (acked or dead-lettered); a first delivery
// (NumDelivered 1) reads nothing, so an event delivered at its first
// attempt costs no key-value request. A consumer reset at a take-over
// (orderedRunner.resetToAckFloor) clears JetStream's delivery counts: an
// event at or below resetThrough, the last sequence delivered before it,
// reads its count whatever its NumDelivered says, so no reset gives an
// event more than MaxDeliver POSTs. See docs/ordering.md.
type failedAttempts struct {
	kv  jetstream.KeyValue // the park bucket
	sub string
	log *slog.Logger
	// resetThrough is the last stream sequence the partition consumer
	// had delivered before this owner last reset it (nil or 0: not
	// reset): at the take-over, or by the fence (partition.healFence).
	resetThrough *atomic.Uint64
}

// resetMark returns a resetThrough holding seq.
func resetMark(seq uint64) *atomic.Uint64 {
	var m atomic.Uint64
	m.Store(seq)
	return &m
}

// raiseResetThrough moves resetThrough up to seq (a reset of the
// partition's own consumer); never down.
func (fa failedAttempts) raiseResetThrough(seq uint64) {
	if fa.resetThrough == nil {
		return
	}
	for {
		old := fa.resetThrough.Load()
		if seq <= old || fa.resetThrough.CompareAndSwap(old, seq) {
			return
		}
	}
}

// kvTimeout bounds one request of failedAttempts.
const kvTimeout = 5 * time.Second

// first returns the attempt number of the next POST of m (event id id):
// 1 plus the failed attempts recorded for it, and whether a count is
// recorded (to be deleted when m settles). When the count cannot be read,
// it warns and starts from 1: MaxDeliver then bounds this owner's attempts.
func (fa failedAttempts) first(m jetstream.Msg, id string) (attempt int, recorded bool) {
	if !fa.redelivered(m) || fa.kv == nil || id == "" {
		return 1, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	e, err := fa.kv.Get(ctx, wire.AttemptsKey(fa.sub, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 1, false
	}
	if err != nil {
		fa.log.Warn("reading the event's failed attempts failed; counting from 1", slog.String("event_id", id), slog.Any("error", err))
		return 1, false
	}
	n, err := strconv.Atoi(string(e.Value()))
	if err != nil || n < 0 {
		fa.log.Warn("the event's failed attempts count is not a number; counting from 1", slog.String("event_id", id), slog.String("value", string(e.Value())))
		return 1, true
	}
	return n + 1, true
}

// redelivered reports whether m may have been delivered before: its
// delivery count says so, or it is at or below resetThrough (a reset
// cleared its count), or its metadata cannot be read.
func (fa failedAttempts) redelivered(m jetstream.Msg) bool {
	md, err := m.Metadata()
	return err != nil || md.NumDelivered > 1 || (fa.resetThrough != nil && md.Sequence.Stream <= fa.resetThrough.Load())
}

// failed records that attempt (1-based) of event id failed and will be
// retried.
func (fa failedAttempts) failed(id string, attempt int) {
	if fa.kv == nil || id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	if _, err := fa.kv.Put(ctx, wire.AttemptsKey(fa.sub, id), []byte(strconv.Itoa(attempt))); err != nil {
		fa.log.Warn("recording the event's failed attempt failed; a next owner counts fewer", slog.String("event_id", id), slog.Int("attempt", attempt), slog.Any("error", err))
	}
}

// settled deletes the count of event id when one was recorded.
func (fa failedAttempts) settled(id string, recorded bool) {
	if !recorded || fa.kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), kvTimeout)
	defer cancel()
	if err := fa.kv.Delete(ctx, wire.AttemptsKey(fa.sub, id)); err != nil {
		fa.log.Debug("deleting the event's failed attempts count failed", slog.String("event_id", id), slog.Any("error", err))
	}
}
