package consumer

import (
	"context"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/shared"
	"github.com/jsbridge/jsbridge/wire"
)

// sharedParked returns the streams the shared engine parked for
// subscription (all when ""): the parked asides of the partition records
// in the positions bucket (position.ReadAll), each described by its
// head's dead letter in q (found by subscription, stream and events
// stream sequence). Nothing is held in memory: the events behind the
// head are in the events stream.
// None when the bucket does not exist.
func sharedParked(ctx context.Context, js jetstream.JetStream, q *deadletter.DLQ, subscription string) ([]ParkedStream, error) {
	kv, err := shared.PositionsBucket(ctx, js, "")
	if err != nil || kv == nil {
		return nil, err
	}
	parts, err := position.ReadAll(ctx, kv)
	if err != nil {
		return nil, err
	}
	var out []ParkedStream
	var letters []deadletter.Stored
	listed := false
	for _, p := range parts {
		for _, a := range p.Record.Asides {
			if a.State != fanout.AsideParked || (subscription != "" && a.Sub != subscription) {
				continue
			}
			if !listed {
				if letters, err = q.List(ctx, subscription); err != nil {
					return nil, err
				}
				listed = true
			}
			ps := ParkedStream{Subscription: a.Sub, Stream: a.Stream, Partition: p.Partition}
			i := slices.IndexFunc(letters, func(dl deadletter.Stored) bool {
				return dl.Subscription == a.Sub && dl.StreamSeq == a.From && wire.StreamKey(dl.Subject) == a.Stream
			})
			if i >= 0 {
				dl := letters[i]
				if name, err := wire.DecodeHeaderValue(dl.Header.Get(wire.HeaderSubject)); err == nil && name != "" {
					ps.Stream = name
				}
				ps.Subject, ps.HeadEventID, ps.ParkedAt, ps.Reason = dl.Subject, dl.EventID, dl.DeadLetteredAt, dl.Reason
				ps.HeadVersion = dl.Header.Get(wire.HeaderStreamVersion)
				ps.OrderStuck = strings.HasPrefix(dl.Reason, "order-stuck")
			}
			out = append(out, ps)
		}
	}
	slices.SortFunc(out, func(a, b ParkedStream) int { return a.ParkedAt.Compare(b.ParkedAt) })
	return out, nil
}
