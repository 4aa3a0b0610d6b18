package legacy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/nats-io/nats.go/jetstream"
)

// ParkEntries reads the entries of the park bucket kv (nil: none) whose
// keys match filter, by key; a key deleted between the listing and its
// read is passed over.
func ParkEntries(ctx context.Context, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	if kv == nil {
		return nil, nil
	}
	keys, err := jsapi.Keys(ctx, kv, filter)
	if err != nil {
		return nil, fmt.Errorf("migrate: park bucket: %w", err)
	}
	var out []jetstream.KeyValueEntry
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: read %q of the park bucket: %w", k, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// ListParked reads the park entries of subscription from the park bucket
// kv (nil: none), by key; an entry deleted meanwhile is passed over.
func ListParked(ctx context.Context, kv jetstream.KeyValue, subscription string) ([]ParkEntry, error) {
	entries, err := ParkEntries(ctx, kv, subscription+".*")
	if err != nil {
		return nil, err
	}
	var out []ParkEntry
	for _, e := range entries {
		var pe ParkEntry
		if err := json.Unmarshal(e.Value(), &pe); err != nil {
			return nil, fmt.Errorf("migrate: the park entry %q: %w", e.Key(), err)
		}
		out = append(out, pe)
	}
	return out, nil
}
