package shared

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// chain is the replica's fanout.Chain: a stream's first event since the
// claim, when the record holds no entry for it, names as predecessor the
// stream's last event before it that the subscription's filters match,
// as the events stream's leader has it (docs/design/next-engine.md,
// "What a new owner does", step 5). Every such event is at or below the
// floor, so it was settled. The leader's message get has no "last
// before" (last_by_subj takes no bound, and would name a later event of
// the stream), so the look-up is jsapi.LastBefore: a direct get's
// candidate confirmed by the leader's next_by_subj.
//
// Not yet: stepping over the versions dead-lettered and not delivered
// since (the old engine's deadletter.Skipped, skipped.<sub>.<stream>).
type chain struct {
	js      jetstream.JetStream
	stream  string
	members *fanout.Members
}

// Previous implements fanout.Chain.
func (c *chain) Previous(ctx context.Context, sub, stream string, seq uint64) (int64, error) {
	m, ok := c.members.Get(sub)
	if !ok {
		return fanout.NoPrevious, nil
	}
	var subjects []string
	for _, f := range m.Filters {
		if s, ok := wire.IntersectFilters(f, stream+".*"); ok {
			subjects = append(subjects, s)
		}
	}
	at, hdr, err := jsapi.LastBefore(ctx, c.js, c.stream, subjects, 0, seq)
	if err != nil {
		return 0, fmt.Errorf("shared: predecessor of %s before %d: %w", stream, seq, err)
	}
	if at == 0 {
		return fanout.NoPrevious, nil
	}
	v, err := strconv.ParseInt(hdr.Get(wire.HeaderStreamVersion), 10, 64)
	if err != nil {
		// A predecessor without a stream version (published by another
		// program) has no place in the chain: none is named.
		return fanout.NoPrevious, nil
	}
	return v, nil
}
