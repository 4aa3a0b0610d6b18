package jsapi

import (
	"context"
	"errors"

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
