package position

// The members key: the names of a partition's live subscriptions, kept
// apart from the record so that a commit does not write every member
// again. A record that references one (format 2) holds only the members
// the key does not: those not in it, those live from above the floor, and
// the names in it that are no longer members.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// compactMin and compactDiv decide when a commit writes a new members
// key: once the members the record must list because the key does not
// say them (joined since, or gone since) reach compactMin plus a
// compactDiv-th of the key's names. Each name a new key writes is then
// paid for by a compactDiv-th of a membership change at most, and a
// record lists at most about that many of them.
const (
	compactMin = 64
	compactDiv = 16
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

// members is a members key as written: its name and the subscription
// names it holds.
type members struct {
	key   string
	names map[string]struct{}
}

// baseRef is what a format 2 record says of its members key: its name,
// its count of names, and the names in it that are no longer members.
type baseRef struct {
	key   string
	count uint64
	left  []string
}

// split returns what r's encoding writes against members key b (nil:
// none): the members the record lists (those not in b, or live from
// above the floor) and the names of b that are no longer members, in no
// order (encodeSplit sorts them); and missing, how many of those two b
// does not say (the members not in it and the names gone).
func split(r *Record, b *members) (listed, left []string, missing int) {
	if b == nil {
		listed = slices.AppendSeq(make([]string, 0, len(r.Members)), maps.Keys(r.Members))
		return listed, nil, len(listed)
	}
	inBase := 0
	for sub, from := range r.Members {
		_, in := b.names[sub]
		if in {
			inBase++
		} else {
			missing++
		}
		if !in || from > r.Floor {
			listed = append(listed, sub)
		}
	}
	if inBase < len(b.names) {
		for sub := range b.names {
			if _, ok := r.Members[sub]; !ok {
				left = append(left, sub)
			}
		}
	}
	return listed, left, missing + len(left)
}

// compactAt is how many members a record written against b may list
// that b does not say before a new members key is written instead (see
// compactMin).
func compactAt(b *members) int {
	if b == nil {
		return compactMin
	}
	return compactMin + len(b.names)/compactDiv
}

// membersOf returns a members key named key holding r's members.
func membersOf(r *Record, key string) *members {
	names := make(map[string]struct{}, len(r.Members))
	for sub := range r.Members {
		names[sub] = struct{}{}
	}
	return &members{key: key, names: names}
}

// encode returns the key's value: 'M' 1 n, then the names in order, each
// as the length it shares with the one before and the rest (subscription
// names of one deployment share long prefixes).
func (m *members) encode() []byte {
	names := slices.Sorted(maps.Keys(m.names))
	e := encoder{b: make([]byte, 0, 8+8*len(names))}
	e.b = append(e.b, 'M', 1)
	e.uint(uint64(len(names)))
	prev := ""
	for _, s := range names {
		n := 0
		for n < len(s) && n < len(prev) && s[n] == prev[n] {
			n++
		}
		e.uint(uint64(n))
		e.str(s[n:])
		prev = s
	}
	return e.b
}

// decodeMembers reads a members key's value.
func decodeMembers(key string, b []byte) (*members, error) {
	d := decoder{b: b}
	if len(b) < 2 || b[0] != 'M' || b[1] != 1 {
		d.fail("not a version 1 members key")
		d.b = nil
	} else {
		d.b = d.b[2:]
	}
	n := d.count()
	m := &members{key: key, names: make(map[string]struct{}, n)}
	prev := ""
	for range n {
		shared := d.uint()
		if shared > uint64(len(prev)) {
			d.fail("shared prefix longer than the name before")
			break
		}
		s := prev[:shared] + d.str()
		m.names[s] = struct{}{}
		prev = s
	}
	return m, d.end()
}

// withBase completes a record decoded from a format 2 encoding with its
// members key m (read by the caller under ref.key): every name of m not
// gone is a member live from the record's floor, unless the record lists
// it. Errors: ErrCorrupt when m is not the key the record names (its
// count differs, or a name gone is not in it).
func withBase(r *Record, ref baseRef, m *members) error {
	if uint64(len(m.names)) != ref.count {
		return fmt.Errorf("%w: members key %q holds %d names, the record says %d", ErrCorrupt, ref.key, len(m.names), ref.count)
	}
	gone := make(map[string]struct{}, len(ref.left))
	for _, sub := range ref.left {
		if _, ok := m.names[sub]; !ok {
			return fmt.Errorf("%w: the record says %q left members key %q, which does not hold it", ErrCorrupt, sub, ref.key)
		}
		gone[sub] = struct{}{}
	}
	if len(m.names) > 0 && r.Members == nil {
		r.Members = make(map[string]uint64, len(m.names))
	}
	for sub := range m.names {
		if _, ok := gone[sub]; ok {
			continue
		}
		if _, listed := r.Members[sub]; !listed {
			r.Members[sub] = r.Floor
		}
	}
	return nil
}

// errMembersGone is wrapped in the error of reading a record whose
// members key is not in the bucket.
var errMembersGone = errors.New("the members key the record names is not in the bucket")

// readBase reads the members key ref names from the bucket's stream
// leader and completes rec with it (withBase); nil for a record that
// names none. A key that is not there is ErrCorrupt: the record is never
// read without its members (their subscriptions would start again).
func readBase(ctx context.Context, js jetstream.JetStream, bucket string, rec *Record, ref baseRef) (*members, error) {
	if ref.key == "" {
		return nil, nil
	}
	val, rev, err := leaderGet(ctx, js, bucket, ref.key)
	if err != nil {
		return nil, err
	}
	if rev == 0 {
		return nil, fmt.Errorf("%w: %w: %q", ErrCorrupt, errMembersGone, ref.key)
	}
	m, err := decodeMembers(ref.key, val)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", ref.key, err)
	}
	return m, withBase(rec, ref, m)
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
		keep[p.st.base.key] = true // named by the claim's record or a commit since
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
