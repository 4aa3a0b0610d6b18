package legacy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// Subscription is one subscription of the old layout: its name (the
// unordered durable's, the partition consumers' prefix) and whether it is
// ordered (ordering: stream).
type Subscription struct {
	Name    string `json:"name"`
	Ordered bool   `json:"ordered"`
}

// Discover lists the subscriptions the old layout on js holds for the
// events stream events (default wire.DefaultEventsStream), by name: an
// ordered one for each name with partition consumers on the partitioned
// copy (PartitionDurable), an unordered one for each durable of the
// events stream the old engine made (its description starts with
// DurableDescription) and no partition consumers. A subscription
// switched to ordered delivery is ordered: its old unordered durable
// only gave its partition consumers their start. Consumers of anyone
// else are passed over. Errors: the events stream missing, and the
// server's.
func Discover(ctx context.Context, js jetstream.JetStream, events string) ([]Subscription, error) {
	if events == "" {
		events = wire.DefaultEventsStream
	}
	ordered := map[string]bool{}
	copyName := CopyStream(events)
	switch s, err := js.Stream(ctx, copyName); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return nil, fmt.Errorf("migrate: partitioned copy %q: %w", copyName, err)
	default:
		names, err := consumerNames(ctx, s)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if sub, _, ok := ParsePartitionDurable(n); ok {
				ordered[sub] = true
			}
		}
	}
	s, err := js.Stream(ctx, events)
	if err != nil {
		return nil, fmt.Errorf("migrate: events stream %q: %w", events, err)
	}
	var out []Subscription
	for sub := range ordered {
		out = append(out, Subscription{Name: sub, Ordered: true})
	}
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Config.Durable != "" && strings.HasPrefix(ci.Config.Description, DurableDescription) && !ordered[ci.Name] {
			out = append(out, Subscription{Name: ci.Name})
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("migrate: list the consumers of %q: %w", events, err)
	}
	slices.SortFunc(out, func(a, b Subscription) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// consumerNames lists the consumers of s by name.
func consumerNames(ctx context.Context, s jetstream.Stream) ([]string, error) {
	var out []string
	l := s.ConsumerNames(ctx)
	for n := range l.Name() {
		out = append(out, n)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("migrate: list the consumers of %q: %w", s.CachedInfo().Config.Name, err)
	}
	return out, nil
}
