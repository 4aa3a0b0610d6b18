package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/base"
	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// The operator's side of disabled subscriptions (health.go): disable,
// enable and list them in the health bucket, without a running consumer.

// SetDisabled disables subscription name for every replica (an operator's
// `consumer subscriptions disable`): it writes its key in the health
// bucket (created when missing) with reason and the time on arch's clock
// (nil: base.Default's, the real one), keeping an existing record. It
// announces nothing.
func SetDisabled(ctx context.Context, arch *base.Archetype, js jetstream.JetStream, name, reason string) error {
	at := base.Default(arch).Clock.Now()
	kv, err := healthBucket(ctx, js, 0)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(DisabledRecord{Subscription: name, Reason: reason, At: at.UTC()})
	if _, err := kv.Create(ctx, wire.DisabledKey(name), data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("deliver: disable subscription %q: %w", name, err)
	}
	return nil
}

// Enable enables subscription name for every replica: it deletes its key
// from the health bucket. It reports whether the subscription was
// disabled.
func Enable(ctx context.Context, js jetstream.JetStream, name string) (bool, error) {
	kv, err := jsapi.ExistingKeyValue(ctx, js, wire.DefaultHealthBucket)
	if err != nil {
		return false, fmt.Errorf("deliver: enable subscription %q: %w", name, err)
	}
	if kv == nil {
		return false, nil
	}
	if _, err := kv.Get(ctx, wire.DisabledKey(name)); errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("deliver: enable subscription %q: %w", name, err)
	}
	if err := kv.Delete(ctx, wire.DisabledKey(name)); err != nil {
		return false, fmt.Errorf("deliver: enable subscription %q: %w", name, err)
	}
	return true, nil
}

// ReadDisabled returns the disabled subscriptions' records, by name. A
// missing health bucket reads as none.
func ReadDisabled(ctx context.Context, js jetstream.JetStream) ([]DisabledRecord, error) {
	kv, err := jsapi.ExistingKeyValue(ctx, js, wire.DefaultHealthBucket)
	if err != nil {
		return nil, fmt.Errorf("deliver: read disabled subscriptions: %w", err)
	}
	if kv == nil {
		return nil, nil
	}
	return readDisabled(ctx, kv)
}

// readDisabled is ReadDisabled of the health bucket kv.
func readDisabled(ctx context.Context, kv jetstream.KeyValue) ([]DisabledRecord, error) {
	keys, err := kv.ListKeysFiltered(ctx, wire.DisabledKeyPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("deliver: read disabled subscriptions: %w", err)
	}
	var out []DisabledRecord
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // enabled meanwhile
		}
		var rec DisabledRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			rec = DisabledRecord{Reason: "unreadable record"}
		}
		rec.Subscription = strings.TrimPrefix(k, wire.DisabledKeyPrefix)
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Subscription < out[j].Subscription })
	return out, nil
}
