package jsapi

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyValue opens the key-value bucket cfg.Bucket, creating it with cfg
// when it does not exist. An existing bucket is taken as it is (its
// configuration is the operator's), and one created by another process
// between the look-up and the create is opened. Errors are nats.go's,
// unwrapped: the caller names the bucket's role.
func KeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, err
}

// ExistingKeyValue opens the key-value bucket name without creating it:
// nil and no error when it does not exist (a reader's empty bucket).
// Errors are nats.go's, unwrapped: the caller names the bucket's role.
func ExistingKeyValue(ctx context.Context, js jetstream.JetStream, name string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	return kv, err
}

// Keys lists the keys of kv matching any of filters (every key when
// none), sorted; none for an empty bucket. Errors name the bucket.
func Keys(ctx context.Context, kv jetstream.KeyValue, filters ...string) ([]string, error) {
	var l jetstream.KeyLister
	var err error
	if len(filters) == 0 {
		l, err = kv.ListKeys(ctx)
	} else {
		l, err = kv.ListKeysFiltered(ctx, filters...)
	}
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the keys of bucket %q: %w", kv.Bucket(), err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	_ = l.Stop() // done already once Keys is drained
	slices.Sort(keys)
	return keys, nil
}
