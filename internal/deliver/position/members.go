package position

// The members key in the bucket: its name, reading it back with the
// record that names it, and dropping the keys no record names. Its value
// and how a record is written against it are package record's
// (record.Members).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
)

// MembersKey is a members key of partition p: "mem.p<p>.<claim>.<n>",
// the claim token of the owner that wrote it and its count of keys
// written. A key is written once and never changed; the record names the
// one it goes with, and the others are deleted.
func MembersKey(p int, claim string, n uint64) string {
	return "mem.p" + strconv.Itoa(p) + "." + claim + "." + strconv.FormatUint(n, 10)
}

// membersFilter matches every members key of partition p.
func membersFilter(p int) string { return "mem.p" + strconv.Itoa(p) + ".>" }

// errMembersGone is wrapped in the error of reading a record whose
// members key is not in the bucket.
var errMembersGone = errors.New("the members key the record names is not in the bucket")

// readBase reads the members key ref names from the bucket's stream
// leader and completes rec with it (record.WithBase); nil for a record that
// names none. A key that is not there is ErrCorrupt: the record is never
// read without its members (their subscriptions would start again).
func readBase(ctx context.Context, js jetstream.JetStream, bucket string, rec *Record, ref record.BaseRef) (*record.Members, error) {
	if ref.Key == "" {
		return nil, nil
	}
	val, rev, err := leaderGet(ctx, js, bucket, ref.Key)
	if err != nil {
		return nil, err
	}
	if rev == 0 {
		return nil, fmt.Errorf("%w: %w: %q", ErrCorrupt, errMembersGone, ref.Key)
	}
	m, err := record.DecodeMembers(ref.Key, val)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", ref.Key, err)
	}
	return m, record.WithBase(rec, ref, m)
}

// dropStaleMembers deletes the partition's members keys other than the
// one its record named at the claim: a commit's whose record never
// landed, or one whose delete after a later commit failed. Run calls it
// once, as it starts; a key a former owner writes after its listing
// stays until the next claim.
func (p *Partition) dropStaleMembers(ctx context.Context) error {
	bucket := p.kv.Bucket()
	s, err := p.js.Stream(ctx, "KV_"+bucket)
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = s.Info(ctx, jetstream.WithSubjectFilter("$KV."+bucket+"."+membersFilter(p.cfg.Partition)))
	}
	if err != nil {
		return fmt.Errorf("position: list the members keys of partition %d in bucket %q: %w", p.cfg.Partition, bucket, err)
	}
	p.mu.Lock()
	keep := map[string]bool{}
	if p.st.base != nil {
		keep[p.st.base.Key] = true // named by the claim's record or a commit since
	}
	for _, k := range p.stale {
		keep[k] = true // the commits drop them
	}
	p.mu.Unlock()
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, "$KV."+bucket+".")
		if keep[key] || strings.Contains(key, "."+p.token+".") {
			continue // this claim's own: a commit writes it, or names it
		}
		p.dropMembersKey(ctx, s, key)
	}
	return nil
}

// dropMembersKey purges key from the bucket's stream s (nil: looked up):
// a purge of its subject, not a key-value delete, which would leave a
// marker for every key ever written, each under a name of its own. A
// failure is logged; the next claim drops the key again.
func (p *Partition) dropMembersKey(ctx context.Context, s jetstream.Stream, key string) {
	bucket := p.kv.Bucket()
	var err error
	if s == nil {
		s, err = p.js.Stream(ctx, "KV_"+bucket)
	}
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+key))
	}
	if err != nil {
		p.cfg.Logger.Warn("dropping a members key no record names failed; the next claim drops it", slog.String("key", key), slog.Any("error", err))
	}
}
