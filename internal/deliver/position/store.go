package position

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// bucketConfig is the positions bucket's configuration as Bucket creates
// it: file storage, history 1, no TTL (a dead owner's record must outlive
// its lease), replicas as given. As for the lease and park buckets, the
// caller passes its configured replica count or, when that is 0, the
// events stream's.
func bucketConfig(name string, replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: name, Description: "jsbridge consumer positions: a record per partition, a cursor per subscription behind",
		Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	}
}

// Bucket returns the positions bucket name (DefaultBucket when empty),
// creating it with bucketConfig when it does not exist. An existing
// bucket is taken as it is.
func Bucket(ctx context.Context, js jetstream.JetStream, name string, replicas int) (jetstream.KeyValue, error) {
	if name == "" {
		name = DefaultBucket
	}
	kv, err := jsapi.KeyValue(ctx, js, bucketConfig(name, replicas))
	if err != nil {
		return nil, fmt.Errorf("position: key-value bucket %q: %w", name, err)
	}
	return kv, nil
}

// casLost reports whether a key-value Create or Update failed because the
// key changed since it was read.
func casLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// leaderGet reads key's last value from the bucket's stream leader (the
// message get API, which only the leader answers; the KV's Get is a
// direct get, which a lagging follower may answer): its value and
// revision, or 0 when it has none (never written, or deleted).
func leaderGet(ctx context.Context, js jetstream.JetStream, bucket, key string) ([]byte, uint64, error) {
	m, found, err := jsapi.LeaderGet(ctx, js, "KV_"+bucket, jsapi.GetRequest{LastFor: "$KV." + bucket + "." + key})
	if err != nil {
		return nil, 0, fmt.Errorf("position: read %q from the leader of bucket %q: %w", key, bucket, err)
	}
	if !found || len(m.Data) == 0 {
		return nil, 0, nil // never written, or a delete marker
	}
	return m.Data, m.Seq, nil
}
