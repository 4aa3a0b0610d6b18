package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
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

// Replay POSTs each dead letter once more to its subscription's endpoint,
// signed with the subscription's current secrets and with the same
// Idempotency-Key (the event id), outside the circuit breaker, and removes
// it from q once the endpoint answers 2xx
// (jsbridge_consumer_dead_letters_replayed_total counts those); when it
// was the head of a parked stream (an ordered subscription), the stream is
// unparked (deadletter.Unpark) and its held events follow, in order. A dead
// letter that fails again stays where it is. The subscriptions are matched
// by name; a dead letter of a subscription c does not have gets an error
// wrapping ErrUnknownSubscription. Replay returns one result per letter, in
// order; it stops early only when ctx ends.
func (c *Consumer) Replay(ctx context.Context, q *deadletter.DLQ, letters []deadletter.Stored) []ReplayResult {
	byName := make(map[string]*runner, len(c.runners))
	for _, r := range c.runners {
		byName[r.sub.Name] = r
	}
	out := make([]ReplayResult, 0, len(letters))
	for _, dl := range letters {
		if ctx.Err() != nil {
			break
		}
		res := ReplayResult{Letter: dl}
		r, ok := byName[dl.Subscription]
		switch {
		case !ok:
			res.Err = fmt.Errorf("dead letter %d: %w: %q", dl.Seq, ErrUnknownSubscription, dl.Subscription)
		case dl.EventID == "":
			res.Err = fmt.Errorf("dead letter %d has no event id: it cannot be replayed", dl.Seq)
		default:
			res = r.replay(ctx, q, dl)
		}
		out = append(out, res)
	}
	return out
}

// replay delivers one dead letter and removes it when delivered.
func (r *runner) replay(ctx context.Context, q *deadletter.DLQ, dl deadletter.Stored) ReplayResult {
	res := ReplayResult{Letter: dl}
	log := r.log.With(slog.String("event_id", dl.EventID), slog.Uint64("dlq_seq", dl.Seq))
	hdr := r.requestHeader()
	body, err := buildBody(r.sub.Body, dl.EventID, dl.Header, dl.Data, hdr)
	if err != nil {
		res.Err = fmt.Errorf("dead letter %d: %w", dl.Seq, err)
		return res
	}
	resp := r.post(ctx, nil, dl.EventID, body, hdr)
	res.Status = resp.status
	if resp.verdict() != verdictAck {
		res.Err = fmt.Errorf("dead letter %d: replay to %s: %s", dl.Seq, r.endpoint, resp.reason())
		log.Warn("replay failed; the dead letter stays", slog.Int("status", resp.status), slog.String("reason", resp.reason()))
		return res
	}
	if err := q.Delete(ctx, dl.Seq); err != nil {
		res.Err = fmt.Errorf("dead letter %d delivered but not removed: %w", dl.Seq, err)
		return res
	}
	res.Delivered = true
	r.metrics.replayed.WithLabelValues(r.sub.Name).Inc()
	log.Info("dead letter replayed", slog.Int("status", resp.status))
	// When it was the head of a parked stream (whatever this process's
	// ordering flag says), the stream's held events follow, in order, from
	// the partition's owner.
	if err := deadletter.Unpark(ctx, r.js, dl); err != nil && !errors.Is(err, deadletter.ErrNotParked) {
		res.Err = fmt.Errorf("dead letter %d delivered and removed, but its stream is still parked; release it with: nats kv del %s %s: %w",
			dl.Seq, wire.DefaultParkBucket, wire.ParkedKey(dl.Subscription, wire.StreamKey(dl.Subject)), err)
	} else if err == nil {
		log.Info("stream unparked; its held events follow")
	}
	return res
}
