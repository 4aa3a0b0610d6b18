package position

import (
	"fmt"
	"maps"
	"slices"

	"github.com/jsbridge/jsbridge/internal/deliver/position/record"
)

// state is a claimed partition's positions in memory: the record the next
// commit holds and the cursors. Its methods keep the record's rules on
// values alone (no I/O, no lock: Partition holds it under its mutex).
type state struct {
	rec     Record
	cursors map[string]*cursorKey
	base    *record.Members // the members key the next commit's record is written against (nil: none)
}

// cursorKey is one subscription's cursor and its key's state.
type cursorKey struct {
	c      Cursor // what its next write holds
	stored Cursor // what its key holds
	rev    uint64 // the key's revision; 0: not written yet
	dirty  bool
	gone   bool // rejoined: deleted after the commit listing the member
}

// live returns sub's cursor, nil when it has none (or it rejoined).
func (s *state) live(sub string) *cursorKey {
	if ck := s.cursors[sub]; ck != nil && !ck.gone {
		return ck
	}
	return nil
}

// settled records sub's settlement of e on stream, in its cursor when it
// has one, else in the record.
func (s *state) settled(sub, stream string, e Entry) {
	if ck := s.live(sub); ck != nil {
		ck.c.Streams = ensure(ck.c.Streams)
		raise(ck.c.Streams, stream, e)
		ck.dirty = true
		return
	}
	s.rec.Ahead = ensure(s.rec.Ahead)
	s.rec.Ahead[sub] = ensure(s.rec.Ahead[sub])
	raise(s.rec.Ahead[sub], stream, e)
}

// edit runs fn on the record with its maps allocated, keeping its owner,
// claim and epoch.
func (s *state) edit(fn func(*Record)) {
	r := &s.rec
	r.Streams, r.Ahead, r.Members = ensure(r.Streams), ensure(r.Ahead), ensure(r.Members)
	owner, claim, epoch := r.Owner, r.Claim, r.Epoch
	fn(r)
	r.Owner, r.Claim, r.Epoch = owner, claim, epoch
}

// editCursor runs fn on sub's cursor, if it has one.
func (s *state) editCursor(sub string, fn func(*Cursor)) bool {
	ck := s.live(sub)
	if ck == nil {
		return false
	}
	ck.c.Streams = ensure(ck.c.Streams)
	fn(&ck.c)
	ck.dirty = true
	return true
}

// detach moves sub from the record to a cursor in state st holding what
// the record says it settled (the floor, its member entry, the shared
// and its own stream entries), unless it has one.
func (s *state) detach(sub, st string) bool {
	old := s.cursors[sub]
	if old != nil && !old.gone {
		return false
	}
	c := Cursor{State: st, Floor: max(s.rec.Floor, s.rec.Members[sub]), Streams: ensure(maps.Clone(s.rec.Streams))}
	for k, e := range s.rec.Ahead[sub] {
		raise(c.Streams, k, e)
	}
	ck := &cursorKey{c: c, dirty: true}
	if old != nil {
		ck.rev, ck.stored = old.rev, old.stored // its key was not deleted yet
	}
	s.cursors[sub] = ck
	delete(s.rec.Ahead, sub)
	delete(s.rec.Members, sub)
	return true
}

// start gives sub, neither a member nor with a cursor, a cursor in state
// st from floor with nothing settled above it (see Partition.StartCursor).
func (s *state) start(sub, st string, floor uint64) bool {
	if _, member := s.rec.Members[sub]; member || s.live(sub) != nil {
		return false
	}
	ck := &cursorKey{c: Cursor{State: st, Floor: floor}, dirty: true}
	if old := s.cursors[sub]; old != nil {
		ck.rev, ck.stored = old.rev, old.stored // its key was not deleted yet
	}
	s.cursors[sub] = ck
	delete(s.rec.Ahead, sub)
	return true
}

// rejoin moves sub from its cursor back to the record (see
// Partition.Rejoin).
func (s *state) rejoin(sub string) bool {
	ck := s.live(sub)
	if ck == nil || ck.c.Floor < s.rec.Floor || slices.ContainsFunc(ck.c.Above, func(seq uint64) bool { return seq > ck.c.Floor }) {
		return false
	}
	s.rec.Ahead, s.rec.Members = ensure(s.rec.Ahead), ensure(s.rec.Members)
	own := ensure(s.rec.Ahead[sub])
	for k, e := range ck.c.Streams {
		raise(own, k, e)
	}
	s.rec.Ahead[sub] = own
	s.rec.Members[sub] = ck.c.Floor
	ck.gone = true
	return true
}

// drop forgets sub (see Partition.Drop).
func (s *state) drop(sub string) bool {
	r := &s.rec
	_, member := r.Members[sub]
	_, ahead := r.Ahead[sub]
	n := len(r.Asides) + len(r.Retries)
	delete(r.Members, sub)
	delete(r.Ahead, sub)
	r.Asides = slices.DeleteFunc(r.Asides, func(a Aside) bool { return a.Sub == sub })
	r.Retries = slices.DeleteFunc(r.Retries, func(e Retry) bool { return e.Sub == sub })
	had := member || ahead || n != len(r.Asides)+len(r.Retries)
	if ck := s.live(sub); ck != nil {
		ck.gone = true
		had = true
	}
	return had
}

// fitted is a commit's record as fit encoded it.
type fitted struct {
	val      []byte
	base     *record.Members // the members key it names (nil: none)
	newBase  bool            // base is to be written before it
	stored   storedRec
	detached []string
}

// fit encodes the record, against the members key of s, or against a new
// one (named by newKey) when the record would list enough members the
// key does not say (record.CompactAt); it detaches the subscriptions with the
// most entries of their own (ties: the first by name) until it is at
// most maxSize bytes; errTooLarge when nobody is left ahead. Besides the
// bytes, it returns what they store (fitted.stored) for the waiters to
// go by once they landed. A membership unchanged costs one pass over the
// members, without encoding or copying them.
func (s *state) fit(maxSize int, newKey func() string) (f fitted, err error) {
	for {
		s.rec.Normalise()
		f.base = s.base
		listed, left, missing := record.Split(&s.rec, f.base)
		if missing >= record.CompactAt(f.base) {
			f.base, f.newBase = record.MembersOf(&s.rec, newKey()), true
			listed, left, _ = record.Split(&s.rec, f.base)
		}
		f.val = s.rec.EncodeSplit(f.base, listed, left)
		if len(f.val) <= maxSize {
			f.stored = storedRec{Record: s.rec.CloneExceptMembers(), base: f.base}
			f.stored.Members = make(map[string]uint64, len(listed))
			for _, sub := range listed {
				f.stored.Members[sub] = s.rec.Members[sub]
			}
			if len(left) > 0 {
				f.stored.left = make(map[string]struct{}, len(left))
				for _, sub := range left {
					f.stored.left[sub] = struct{}{}
				}
			}
			return f, nil
		}
		var top string
		for _, sub := range slices.Sorted(maps.Keys(s.rec.Ahead)) {
			if len(s.rec.Ahead[sub]) > len(s.rec.Ahead[top]) {
				top = sub
			}
		}
		if top == "" {
			return f, fmt.Errorf("%w: %d bytes (cap %d) with no subscription ahead to give a cursor", errTooLarge, len(f.val), maxSize)
		}
		s.detach(top, "behind")
		f.detached = append(f.detached, top)
	}
}

// storedRec is a record as a commit stored it, for the waiters: the
// members the record lists in Members, the others in its members key.
type storedRec struct {
	Record
	base *record.Members     // its members key (nil: Members holds them all)
	left map[string]struct{} // names of base no longer members
}

// member returns sub's member entry and whether sub is a member: a name
// of the members key is one from the floor.
func (s *storedRec) member(sub string) (uint64, bool) {
	if from, ok := s.Members[sub]; ok {
		return from, true
	}
	if s.base == nil {
		return 0, false
	}
	if _, ok := s.base.Names[sub]; !ok {
		return 0, false
	}
	if _, gone := s.left[sub]; gone {
		return 0, false
	}
	return s.Floor, true
}

// Covers is Record.Covers of the stored record.
func (s *storedRec) Covers(sub, stream string, seq uint64) bool {
	from, _ := s.member(sub)
	return s.CoversFrom(sub, stream, seq, from)
}

// covered reports whether what is stored covers sub's settlement of seq
// on stream: its cursor key when the stored record does not list it as a
// member (nothing while that key is not written: the stored floor does
// not speak for a subscription that is no member, such as one started
// below it), else the stored record. The stored record's asides hold
// against the cursor's floor as against its own: a cursor's floor, like
// the record's, passes a stream set aside unsettled (R1), so only its
// stream entry says the aside's events settled.
func (s *state) covered(stored *storedRec, sub, stream string, seq uint64) bool {
	if ck := s.cursors[sub]; ck != nil {
		if _, member := stored.member(sub); !member {
			c := &ck.stored
			if seq <= c.Streams[stream].Seq {
				return ck.rev > 0
			}
			return ck.rev > 0 && c.Covers(stream, seq) && !stored.AsideHolds(sub, stream, seq)
		}
	}
	return stored.Covers(sub, stream, seq)
}

// ensure returns m, allocated when nil.
func ensure[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}

// raise sets m[k] to e unless it holds a later event already.
func raise(m map[string]Entry, k string, e Entry) {
	if e.Seq > m[k].Seq {
		m[k] = e
	}
}
