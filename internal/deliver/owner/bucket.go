package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
)

// The keys of the lease bucket (wire.DefaultLeaseBucket). The old
// engine's per-subscription keys, which `consumer migrate --cleanup`
// removes, never match these filters: theirs have one token more.
const (
	// MemberFilter matches every replica's MemberKey.
	MemberFilter = "member.*"
	// LeaseFilter matches every partition's LeaseKey.
	LeaseFilter = "lease.*"
)

// MemberKey is the membership heartbeat of a consumer replica:
// "member.<replica id>" (one per replica, for every subscription
// together; its value is the id). Replica ids are [A-Za-z0-9_-]+.
func MemberKey(replica string) string { return "member." + replica }

// ParseMemberKey reverses MemberKey.
func ParseMemberKey(key string) (replica string, ok bool) {
	replica, ok = strings.CutPrefix(key, "member.")
	if !ok || replica == "" || strings.Contains(replica, ".") {
		return "", false
	}
	return replica, true
}

// LeaseKey is partition p's lease: "lease.p<p>" (its
// value is the owning replica's id).
func LeaseKey(p int) string { return "lease.p" + strconv.Itoa(p) }

// ParseLeaseKey reverses LeaseKey.
func ParseLeaseKey(key string) (p int, ok bool) {
	n, ok := strings.CutPrefix(key, "lease.p")
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(n)
	if err != nil || p < 0 || strconv.Itoa(p) != n {
		return 0, false
	}
	return p, true
}

// LeaseBucketConfig is the lease bucket's configuration as Bucket creates
// it: keys expire after ttl (the lease TTL), file storage, history 1,
// replicas as given (the caller's configured count, or the events
// stream's).
func LeaseBucketConfig(name string, ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: name, Description: "jsbridge consumer replicas and their partition leases",
		TTL: ttl, Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
	}
}

// Bucket returns the key-value bucket of cfg, creating it when missing.
// An existing bucket is taken as it is (see LeaseTTL for its TTL).
func Bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := jsapi.KeyValue(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("owner: key-value bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// BucketGone reports whether err says a key-value bucket's stream does
// not exist (a KV watch or listing reports nats.ErrStreamNotFound, of
// nats.go's older API): the caller creates it again (Bucket).
func BucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// LeaseTTL returns the lease bucket's TTL, warning on log when it is not
// configured: the bucket was created with another one (by an earlier run,
// or a replica with another --lease-ttl), and its keys expire after it
// whatever a replica was told. A replica renewing on its own longer TTL
// would lose its leases between renewals; on a shorter one, its killed
// partitions would move later than it says. A bucket without a TTL gives
// configured.
func LeaseTTL(ctx context.Context, kv jetstream.KeyValue, configured time.Duration, log *slog.Logger) (time.Duration, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("owner: key-value bucket %q: %w", kv.Bucket(), err)
	}
	ttl := st.TTL()
	if ttl <= 0 {
		return configured, nil
	}
	if ttl != configured {
		log.Warn(fmt.Sprintf("the lease bucket's TTL is not the configured lease TTL; using the bucket's, which every replica shares. "+
			"To change it, stop every replica, then delete the bucket (nats kv del %s)", kv.Bucket()),
			slog.Duration("bucket_ttl", ttl), slog.Duration("lease_ttl", configured))
	}
	return ttl, nil
}
