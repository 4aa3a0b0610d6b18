package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/webhook"
	"github.com/jsbridge/jsbridge/wire"
)

// ErrUnknownSubscription is wrapped by Consumer.Replay when a dead letter
// names a subscription the Consumer was not given.
var ErrUnknownSubscription = errors.New("subscription not configured")

// ReplayResult is the outcome of replaying one dead letter.
type ReplayResult struct {
	// Letter is the dead letter replayed.
	Letter deadletter.Stored
	// Delivered is true when the endpoint answered 2xx and the dead letter
	// was removed from the dead-letter stream.
	Delivered bool
	// Status is the HTTP status (0 without a response).
	Status int
	// Err says why it was not delivered or not removed; nil when Delivered.
	Err error
}

// replay delivers one dead letter with r, outside the circuit breaker,
// and removes it from q when delivered; js holds the park bucket.
func replay(ctx context.Context, r *runner, js jetstream.JetStream, q *deadletter.DLQ, dl deadletter.Stored) ReplayResult {
	res := ReplayResult{Letter: dl}
	log := r.log.With(slog.String("event_id", dl.EventID), slog.Uint64("dlq_seq", dl.Seq))
	// The version chain: the predecessor the failed attempt named, which
	// is still what the subscription delivered before it (its stream was
	// parked, or went on naming the same one). A replay is no
	// partition's owner: no partition, no epoch.
	order := ReplayOrder(dl)
	resp, err := r.snd.Direct(ctx, dl.EventID, dl.Header, dl.Data, order)
	if err != nil {
		res.Err = fmt.Errorf("dead letter %d: %w", dl.Seq, err)
		return res
	}
	res.Status = resp.Status
	if resp.Verdict() != attempt.VerdictAck {
		res.Err = fmt.Errorf("dead letter %d: replay to %s: %s", dl.Seq, r.endpoint, resp.Reason())
		log.Warn("replay failed; the dead letter stays", slog.Int("status", resp.Status), slog.String("reason", resp.Reason()))
		return res
	}
	if order != nil {
		// Delivered after all: the stream's next event names it as its
		// predecessor (deadletter.ForgetSkipped), before the unpark lets
		// that event go.
		err := forgetSkipped(ctx, js, dl.Subscription, wire.StreamKey(dl.Subject), order.Version)
		if err != nil {
			res.Err = fmt.Errorf("dead letter %d delivered, but its stream's version chain still skips it; it stays (replay it again: the receiver answers it is a duplicate): %w", dl.Seq, err)
			return res
		}
	}
	if err := q.Delete(ctx, dl.Seq); err != nil {
		res.Err = fmt.Errorf("dead letter %d delivered but not removed: %w", dl.Seq, err)
		return res
	}
	res.Delivered = true
	r.metrics.replayed.WithLabelValues(r.sub.Name).Inc()
	log.Info("dead letter replayed", slog.Int("status", resp.Status))
	// When it was the head of a parked stream (whatever this process's
	// ordering flag says), the stream's held events follow, in order, from
	// the partition's owner.
	if err := deadletter.Unpark(ctx, js, dl); err != nil && !errors.Is(err, deadletter.ErrNotParked) {
		res.Err = fmt.Errorf("dead letter %d delivered and removed, but its stream is still parked; release it with: nats kv del %s %s: %w",
			dl.Seq, wire.DefaultParkBucket, wire.ParkedKey(dl.Subscription, wire.StreamKey(dl.Subject)), err)
	} else if err == nil {
		log.Info("stream unparked; its held events follow")
	}
	return res
}

// ReplayOrder returns the ordering fields a replay of dl sends: the
// stream, version and predecessor of its failed attempt, no partition
// (a replay is no partition's owner); nil when dl carries no version
// chain (an unordered subscription's, or stored before the chain). Both
// engines' replays send it.
func ReplayOrder(dl deadletter.Stored) *webhook.OrderFields {
	if dl.PreviousVersion == "" {
		return nil
	}
	prev, err := wire.ParsePreviousVersion(dl.PreviousVersion)
	if err != nil {
		return nil
	}
	return attempt.OrderFieldsOf(dl.Header, prev, -1, 0)
}

// forgetSkipped removes version of the stream with stream key streamKey
// from subscription's skipped versions (deadletter.ForgetSkipped); no park
// bucket: nothing to forget.
func forgetSkipped(ctx context.Context, js jetstream.JetStream, subscription, streamKey string, version int64) error {
	kv, err := deadletter.ParkBucket(ctx, js)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return deadletter.ForgetSkipped(ctx, kv, subscription, streamKey, version)
}

// withPrevious returns dl, of r's subscription, with the predecessor its
// replay names in the version chain when dl was stored before the chain
// (no PreviousVersion) by an ordered subscription: the stream's last
// event before it in the partitioned copy that the subscription's filters
// select, from its start on, stepped over the versions not delivered, as
// its partition would have named it. dl as it is otherwise, or when that
// cannot be read (logged; the replay then goes without the chain).
func (c *Consumer) withPrevious(ctx context.Context, r *runner, dl deadletter.Stored) deadletter.Stored {
	if dl.PreviousVersion != "" || !r.sub.Ordered() || dl.StreamSeq == 0 {
		return dl
	}
	v, err := strconv.ParseInt(dl.Header.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		return dl
	}
	events, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		r.log.Warn("a dead letter stored before the version chain goes without it: the events stream cannot be read", slog.Uint64("dlq_seq", dl.Seq), slog.Any("error", err))
		return dl
	}
	prefix := ordercopy.EventsPrefix(events.CachedInfo().Config)
	stream, _, err := wire.ParseSubject(prefix, dl.Subject)
	if err != nil {
		return dl
	}
	prev, err := newWindowChain(ctx, c, r.sub, prefix).before(ctx, wire.StreamKey(dl.Subject), stream, v, dl.StreamSeq)
	if err != nil {
		r.log.Warn("a dead letter stored before the version chain goes without it: its predecessor cannot be read", slog.Uint64("dlq_seq", dl.Seq), slog.Any("error", err))
		return dl
	}
	dl.PreviousVersion = wire.FormatPreviousVersion(prev)
	return dl
}
