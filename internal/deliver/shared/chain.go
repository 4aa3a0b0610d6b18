package shared

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
)

// chain is the replica's fanout.Chain: a stream's first event since the
// claim, when the record holds no entry for it, names as predecessor the
// stream's last event before it that the subscription's filters match,
// as the events stream's leader has it (docs/design/next-engine.md,
// "What a new owner does", step 5), stepped over the versions the
// subscription dead-lettered and has not delivered since
// (deadletter.Predecessor, as the old engine's chain.go). Every such
// event is at or below the floor, so it was settled. The skipped
// versions are the records skipped.<sub>.<stream> of the positions
// bucket (moved there from the park bucket by `consumer migrate`), which
// the claim's attempt.Claim writes before it settles a dead letter.
type chain struct {
	js      jetstream.JetStream
	stream  string
	members *member.Index
	// skipped is the positions bucket, set by Start before any claim
	// (nil: no skipped versions are read).
	skipped jetstream.KeyValue
}

// Previous implements fanout.Chain.
func (c *chain) Previous(ctx context.Context, sub, stream string, seq uint64) (int64, error) {
	m, ok := c.members.Get(sub)
	if !ok {
		return fanout.NoPrevious, nil
	}
	v, err := deadletter.Predecessor(ctx, c.js, c.skipped, deadletter.Lookup{Stream: c.stream, Subscription: sub,
		Filters: m.Filters, Key: stream, Before: seq})
	if err != nil {
		return 0, fmt.Errorf("shared: predecessor of %s before %d: %w", stream, seq, err)
	}
	return v, nil
}
