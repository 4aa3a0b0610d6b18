package record

// The members key's value: the names of a partition's live
// subscriptions, kept apart from the record so that a commit does not
// write every member again. A record that references one (format 2)
// holds only the members the key does not: those not in it, those live
// from above the floor, and the names in it that are no longer members.

import (
	"fmt"
	"maps"
	"slices"
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

// Members is a members key as written: its name and the subscription
// names it holds. A key is written once and never changed.
type Members struct {
	// Key is its key in the bucket (position.MembersKey).
	Key string
	// Names are the subscriptions it says are members.
	Names map[string]struct{}
}

// BaseRef is what a format 2 record says of its members key: its name,
// its count of names, and the names in it that are no longer members.
type BaseRef struct {
	// Key names the members key ("" in a format 1 record: none).
	Key string
	// Count is how many names the key holds (a check that it is the
	// key the record was written against).
	Count uint64
	// Left are the key's names that are no longer members.
	Left []string
}

// Split returns what r's encoding writes against members key b (nil:
// none): the members the record lists (those not in b, or live from
// above the floor) and the names of b that are no longer members, in no
// order (EncodeSplit sorts them); and missing, how many of those two b
// does not say (the members not in it and the names gone).
func Split(r *Record, b *Members) (listed, left []string, missing int) {
	if b == nil {
		listed = slices.AppendSeq(make([]string, 0, len(r.Members)), maps.Keys(r.Members))
		return listed, nil, len(listed)
	}
	inBase := 0
	for sub, from := range r.Members {
		_, in := b.Names[sub]
		if in {
			inBase++
		} else {
			missing++
		}
		if !in || from > r.Floor {
			listed = append(listed, sub)
		}
	}
	if inBase < len(b.Names) {
		for sub := range b.Names {
			if _, ok := r.Members[sub]; !ok {
				left = append(left, sub)
			}
		}
	}
	return listed, left, missing + len(left)
}

// CompactAt is how many members a record written against b may list
// that b does not say before a new members key is written instead (see
// compactMin).
func CompactAt(b *Members) int {
	if b == nil {
		return compactMin
	}
	return compactMin + len(b.Names)/compactDiv
}

// MembersOf returns a members key named key holding r's members.
func MembersOf(r *Record, key string) *Members {
	names := make(map[string]struct{}, len(r.Members))
	for sub := range r.Members {
		names[sub] = struct{}{}
	}
	return &Members{Key: key, Names: names}
}

// Encode returns the key's value: 'M' 1 n, then the names in order, each
// as the length it shares with the one before and the rest (subscription
// names of one deployment share long prefixes).
func (m *Members) Encode() []byte {
	names := slices.Sorted(maps.Keys(m.Names))
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

// DecodeMembers reads a members key's value.
func DecodeMembers(key string, b []byte) (*Members, error) {
	d := decoder{b: b}
	if len(b) < 2 || b[0] != 'M' || b[1] != 1 {
		d.fail("not a version 1 members key")
		d.b = nil
	} else {
		d.b = d.b[2:]
	}
	n := d.count()
	m := &Members{Key: key, Names: make(map[string]struct{}, n)}
	prev := ""
	for range n {
		shared := d.uint()
		if shared > uint64(len(prev)) {
			d.fail("shared prefix longer than the name before")
			break
		}
		s := prev[:shared] + d.str()
		m.Names[s] = struct{}{}
		prev = s
	}
	return m, d.end()
}

// WithBase completes a record decoded from a format 2 encoding with its
// Members key m (read by the caller under ref.Key): every name of m not
// gone is a member live from the record's floor, unless the record lists
// it. Errors: ErrCorrupt when m is not the key the record names (its
// count differs, or a name gone is not in it).
func WithBase(r *Record, ref BaseRef, m *Members) error {
	if uint64(len(m.Names)) != ref.Count {
		return fmt.Errorf("%w: members key %q holds %d names, the record says %d", ErrCorrupt, ref.Key, len(m.Names), ref.Count)
	}
	gone := make(map[string]struct{}, len(ref.Left))
	for _, sub := range ref.Left {
		if _, ok := m.Names[sub]; !ok {
			return fmt.Errorf("%w: the record says %q left members key %q, which does not hold it", ErrCorrupt, sub, ref.Key)
		}
		gone[sub] = struct{}{}
	}
	if len(m.Names) > 0 && r.Members == nil {
		r.Members = make(map[string]uint64, len(m.Names))
	}
	for sub := range m.Names {
		if _, ok := gone[sub]; ok {
			continue
		}
		if _, listed := r.Members[sub]; !listed {
			r.Members[sub] = r.Floor
		}
	}
	return nil
}
