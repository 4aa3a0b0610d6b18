package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

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

// replay delivers one dead letter with r, outside the circuit breaker,
// and removes it from q when delivered; js holds the park bucket.
func replay(ctx context.Context, r *sender, js jetstream.JetStream, q *deadletter.DLQ, dl deadletter.Stored) ReplayResult {
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
	if err := deadletter.Unpark(ctx, js, dl); err != nil && !errors.Is(err, deadletter.ErrNotParked) {
		res.Err = fmt.Errorf("dead letter %d delivered and removed, but its stream is still parked; release it with: nats kv del %s %s: %w",
			dl.Seq, wire.DefaultParkBucket, wire.ParkedKey(dl.Subscription, wire.StreamKey(dl.Subject)), err)
	} else if err == nil {
		log.Info("stream unparked; its held events follow")
	}
	return res
}
