package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver"
	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/unpark"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/wire"
)

// Dead-letter replay and skip under the shared engine
// (docs/design/next-engine.md section 3): a letter is POSTed as the
// durables engine POSTs it (attempt.Sender.Direct: outside the breaker,
// Idempotency-Key = event id, the chain's headers from the letter), and
// removed on success. A parked stream (an aside of a partition record in
// the positions bucket) is let go by an operator's request
// (unpark.Write) that the owner of its partition applies: the
// stream's later events are read again from the head's successor, the
// first naming as predecessor the head's version after a replay, the
// head's own predecessor after a skip. Nothing here writes a partition
// record: only its owner does.

// Ops of the requests, for the owner's logs.
const (
	opReplay = "replay"
	opSkip   = "skip"
	opUnpark = "unpark"
)

// Replay POSTs each letter once more to its subscription's endpoint and
// removes it when answered 2xx; a letter that was the head of a parked
// stream then has its stream unparked. See the comment above.
func (e *sharedEngine) Replay(ctx context.Context, q *deadletter.DLQ, letters []deadletter.Stored) []deliver.ReplayResult {
	out := make([]deliver.ReplayResult, len(letters))
	kv, err := shared.PositionsBucket(ctx, e.js, "")
	for i, dl := range letters {
		if err != nil {
			out[i] = deliver.ReplayResult{Letter: dl, Err: fmt.Errorf("dead letter %d: %w", dl.Seq, err)}
			continue
		}
		out[i] = e.replay(ctx, kv, q, dl)
	}
	return out
}

// replay is Replay of one letter; kv is the positions bucket (nil: none).
func (e *sharedEngine) replay(ctx context.Context, kv jetstream.KeyValue, q *deadletter.DLQ, dl deadletter.Stored) deliver.ReplayResult {
	res := deliver.ReplayResult{Letter: dl}
	snd := e.r.Sender(dl.Subscription)
	if snd == nil {
		res.Err = fmt.Errorf("dead letter %d: %w: %q", dl.Seq, deliver.ErrUnknownSubscription, dl.Subscription)
		return res
	}
	log := snd.Logger().With(slog.String("event_id", dl.EventID), slog.Uint64("dlq_seq", dl.Seq))
	stream := wire.StreamKey(dl.Subject)
	order := deliver.ReplayOrder(dl)
	parked := false
	if order != nil {
		var err error
		if parked, err = shared.ParkedHead(ctx, kv, dl.Subscription, stream, dl.StreamSeq); err != nil {
			res.Err = fmt.Errorf("dead letter %d: %w", dl.Seq, err)
			return res
		}
	}
	resp, err := snd.Direct(ctx, dl.EventID, dl.Header, dl.Data, order)
	if err != nil {
		res.Err = fmt.Errorf("dead letter %d: %w", dl.Seq, err)
		return res
	}
	res.Status = resp.Status
	if resp.Verdict() != attempt.VerdictAck {
		res.Err = fmt.Errorf("dead letter %d: replay to %s: %s", dl.Seq, snd.Endpoint(), resp.Reason())
		log.Warn("replay failed; the dead letter stays", slog.Int("status", resp.Status), slog.String("reason", resp.Reason()))
		return res
	}
	if order != nil && kv != nil {
		// Delivered after all: the stream's chain no longer steps over
		// it (the sender recorded it as skipped in the positions bucket).
		if err := deadletter.ForgetSkipped(ctx, kv, dl.Subscription, stream, order.Version); err != nil {
			res.Err = fmt.Errorf("dead letter %d delivered, but its stream's version chain still skips it; it stays (replay it again: the receiver answers it is a duplicate): %w", dl.Seq, err)
			return res
		}
	}
	if parked {
		// The request before the delete: a letter left behind is
		// replayed again (a duplicate the receiver drops), a stream left
		// parked without its letter would need the bucket edited.
		err := unpark.Write(ctx, kv, dl.Subscription, stream, unpark.Request{Head: dl.StreamSeq, Previous: order.Version, Op: opReplay})
		if err != nil {
			res.Err = fmt.Errorf("dead letter %d delivered, but its stream is still parked; it stays (replay it again): %w", dl.Seq, err)
			return res
		}
		log.Info("unpark requested: the partition's owner reads the stream's held events again", slog.String("stream", stream))
	}
	if err := q.Delete(ctx, dl.Seq); err != nil {
		res.Err = fmt.Errorf("dead letter %d delivered but not removed: %w", dl.Seq, err)
		return res
	}
	res.Delivered = true
	e.replayed.WithLabelValues(dl.Subscription).Inc()
	log.Info("dead letter replayed", slog.Int("status", resp.Status))
	return res
}

// skipShared drops dl, the dead-lettered head of a stream the shared
// engine parked: unparkShared, then dl deleted; nothing is POSTed.
func skipShared(ctx context.Context, js jetstream.JetStream, q *deadletter.DLQ, dl deadletter.Stored) error {
	if err := unparkShared(ctx, js, dl, opSkip); err != nil {
		return err
	}
	if err := q.Delete(ctx, dl.Seq); err != nil {
		return fmt.Errorf("stream unparked, but its dead letter %d stays: delete it (do not replay it: its successors went on): %w", dl.Seq, err)
	}
	return nil
}

// unparkShared asks the owner of the partition of dl's stream, which the
// shared engine parked with dl as its head, to let the stream go on
// without the head: its next event names the head's own predecessor
// (the letter's chain header), as after a dead letter of a stream that
// was not parked. op names the command in the owner's logs. dl itself
// is left alone. ErrNotParked (wrapped) when no partition record holds
// dl's stream parked with dl as its head.
func unparkShared(ctx context.Context, js jetstream.JetStream, dl deadletter.Stored, op string) error {
	kv, err := shared.PositionsBucket(ctx, js, "")
	if err != nil {
		return err
	}
	stream := wire.StreamKey(dl.Subject)
	parked, err := shared.ParkedHead(ctx, kv, dl.Subscription, stream, dl.StreamSeq)
	if err != nil {
		return err
	}
	if !parked {
		return fmt.Errorf("dead letter %d: %w", dl.Seq, ErrNotParked)
	}
	prev, err := wire.ParsePreviousVersion(dl.PreviousVersion)
	if err != nil {
		return fmt.Errorf("dead letter %d: its %s header: %w", dl.Seq, wire.HeaderPreviousVersion, err)
	}
	return unpark.Write(ctx, kv, dl.Subscription, stream, unpark.Request{Head: dl.StreamSeq, Previous: prev, Op: op})
}
