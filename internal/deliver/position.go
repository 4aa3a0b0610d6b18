package deliver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
	"github.com/jsbridge/jsbridge/internal/deliver/unordered"
	"github.com/jsbridge/jsbridge/wire"
)

// Position is where one subscription's durable consumers are, for
// `consumer status`.
type Position struct {
	// Name is the subscription's.
	Name string
	// Ordered says whether it reads the partitioned copy (its partition
	// consumers) or the events stream (one durable consumer).
	Ordered bool
	// Partitions is the number of its partition consumers; 0 unordered.
	Partitions int
	// Start is the start its durable consumers were created with
	// (ReportedStart: "(not recorded)" for those created before starts
	// were recorded).
	Start string
	// AckFloor is the events stream's sequence up to which every event
	// of the subscription is settled (acked or dead-lettered); for an
	// ordered subscription the lowest of its partitions', read back from
	// the copy's Nats-Stream-Source header. 0: none yet, or not readable
	// (the copy no longer holds that message).
	AckFloor uint64
	// Pending is the messages not delivered yet plus those out for
	// delivery or waiting for a retry, over all its durable consumers.
	Pending uint64
}

// ReadPositions reads the position of every subscription on the events
// stream events (durable consumers made by deliver, found by their
// description on events and by their names on its partitioned copy), by
// name. A missing copy reads as no ordered subscription.
func ReadPositions(ctx context.Context, js jetstream.JetStream, events string) ([]Position, error) {
	var out []Position
	s, err := js.Stream(ctx, events)
	if err != nil {
		return nil, fmt.Errorf("deliver: JetStream stream %q: %w", events, err)
	}
	infos, err := consumerInfos(ctx, s)
	if err != nil {
		return nil, err
	}
	for _, ci := range infos {
		if strings.HasPrefix(ci.Config.Description, unordered.Description) {
			out = append(out, Position{Name: ci.Name, Start: subscription.ReportedStart(ci.Config), AckFloor: ci.AckFloor.Stream,
				Pending: ci.NumPending + uint64(ci.NumAckPending)})
		}
	}
	cp, err := js.Stream(ctx, wire.OrderedStream(events))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return sortPositions(out), nil
	case err != nil:
		return nil, fmt.Errorf("deliver: JetStream stream %q: %w", wire.OrderedStream(events), err)
	}
	if infos, err = consumerInfos(ctx, cp); err != nil {
		return nil, err
	}
	slices.SortFunc(infos, func(a, b *jetstream.ConsumerInfo) int { return strings.Compare(a.Name, b.Name) })
	byName := map[string]*Position{}
	floors := map[string]uint64{} // the lowest partition ack floor, a copy sequence
	for _, ci := range infos {
		name, _, ok := wire.ParsePartitionDurable(ci.Name)
		if !ok {
			continue
		}
		p := byName[name]
		if p == nil {
			p = &Position{Name: name, Ordered: true, Start: subscription.ReportedStart(ci.Config)}
			byName[name] = p
			floors[name] = ci.AckFloor.Stream
		}
		p.Partitions++
		p.Pending += ci.NumPending + uint64(ci.NumAckPending)
		floors[name] = min(floors[name], ci.AckFloor.Stream)
	}
	for name, p := range byName {
		if f := floors[name]; f > 0 {
			if m, err := cp.GetMsg(ctx, f); err == nil {
				p.AckFloor = wire.SourceSequence(m.Header.Get(wire.HeaderSourceInfo))
			}
		}
		out = append(out, *p)
	}
	return sortPositions(out), nil
}

func sortPositions(ps []Position) []Position {
	slices.SortFunc(ps, func(a, b Position) int { return strings.Compare(a.Name, b.Name) })
	return ps
}

// consumerInfos lists the consumers of s.
func consumerInfos(ctx context.Context, s jetstream.Stream) ([]*jetstream.ConsumerInfo, error) {
	l := s.ListConsumers(ctx)
	var out []*jetstream.ConsumerInfo
	for ci := range l.Info() {
		out = append(out, ci)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("deliver: list the consumers of JetStream stream %q: %w", s.CachedInfo().Config.Name, err)
	}
	return out, nil
}
