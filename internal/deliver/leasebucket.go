package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// buckets are the lease and park buckets' configurations, as provision
// creates them.
type buckets struct {
	js     jetstream.JetStream
	log    *slog.Logger
	leases jetstream.KeyValueConfig
	parks  jetstream.KeyValueConfig
}

// restore creates the lease and park buckets again where they are gone:
// deleted while replicas run (by an operator, or a JetStream store lost).
// The key-value handles the replica holds name their bucket, so they work
// again once it exists; what the deleted buckets held is gone: leases are
// claimed again (a new bucket's epochs are higher, see leaseBucket), and
// a park entry lost lets its stream's held events go on.
func (b buckets) restore(ctx context.Context) {
	for _, cfg := range []jetstream.KeyValueConfig{b.leases, b.parks} {
		if _, err := b.js.KeyValue(ctx, cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		create := bucket
		if cfg.Bucket == b.leases.Bucket {
			create = leaseBucket
		}
		if _, err := create(ctx, b.js, cfg); err != nil {
			b.log.Warn("a key-value bucket of ordered delivery is gone; creating it again failed, retrying at the next round",
				slog.String("bucket", cfg.Bucket), slog.Any("error", err))
			continue
		}
		b.log.Warn("a key-value bucket of ordered delivery was deleted while this replica ran; created it again",
			slog.String("bucket", cfg.Bucket))
	}
}

// bucketGone reports whether err says a key-value bucket's stream does
// not exist (a KV watch or listing reports nats.ErrStreamNotFound, of
// nats.go's older API).
func bucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// leaseBucket returns the lease bucket of cfg, creating it when missing
// with its first revision at firstLeaseRevision(time.Now()).
//
// A lease's epoch (wire.HeaderLeaseEpoch) is its KV create revision, and a
// receiver's order gate refuses an epoch lower than one it processed. A
// bucket created the usual way starts its revisions at 1, so deleting the
// bucket (to change the lease TTL, say) made every new lease's epoch lower
// than the ones before it, and gated receivers refused every stream as
// stale-epoch until an operator reset them. Starting the revisions at the
// creation time in microseconds puts a new bucket above every revision
// an earlier one gave, unless that one gave more than a million
// revisions a second of its life (a lease renewal is one revision; a
// replica renews each lease a few times per TTL).
//
// The bucket's stream is created here rather than by CreateKeyValue,
// which cannot set a first sequence; its configuration is the one
// CreateKeyValue gives (nats.go v1.55) plus FirstSeq, and it is bound as a
// key-value bucket as usual. Two replicas creating it at once: the second
// finds it (their first sequences differ, so JetStream answers "already
// in use") and binds to the first one's.
func leaseBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = js.CreateStream(ctx, leaseStreamConfig(cfg, firstLeaseRevision(time.Now())))
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("deliver: key-value bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// firstLeaseRevision is the first revision of a lease bucket created at
// now: its Unix time in microseconds (about 1.8e15 in 2027, below 2^53,
// so a receiver that parses the epoch as a JSON or JavaScript number
// keeps it exact until the year 2255).
func firstLeaseRevision(now time.Time) uint64 {
	return uint64(now.UnixMicro())
}

// leaseStreamConfig is the JetStream stream behind the key-value bucket
// cfg (bucket name, description, TTL, storage, replicas, history), as
// CreateKeyValue makes it, starting at sequence first.
func leaseStreamConfig(cfg jetstream.KeyValueConfig, first uint64) jetstream.StreamConfig {
	history := int64(max(cfg.History, 1))
	duplicates := 2 * time.Minute
	if cfg.TTL > 0 && cfg.TTL < duplicates {
		duplicates = cfg.TTL
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + cfg.Bucket,
		Description:       cfg.Description,
		Subjects:          []string{"$KV." + cfg.Bucket + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          -1,
		MaxAge:            cfg.TTL,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           cfg.Storage,
		Replicas:          max(cfg.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        duplicates,
		Discard:           jetstream.DiscardNew,
		FirstSeq:          first,
	}
}
