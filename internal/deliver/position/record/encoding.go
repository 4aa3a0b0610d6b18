package record

import (
	"cmp"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
)

// The encoding is binary, not JSON: a record of 16 subscriptions ahead on
// 100 streams each is about 8 bytes an entry here against about 40 in
// JSON, and it is written up to a few hundred times a second. Integers
// are unsigned varints; every name (stream, subscription, state) is
// written once in a table and referred to by its index; entry sequences
// are written above the floor, so they stay short. Maps are written in
// name order, so one record always encodes to the same bytes.
//
//	record: 'P' 1 owner claim epoch created floor table
//	        streams(n, n×(name, seq-floor, version))
//	        ahead(n, n×(sub, streams…)) members(n, n×(sub, from))
//	        asides(n, n×(sub, stream, from, state)) retries(n, n×(sub, seq, attempts))
//	        detached(n, n×(from, m, m×sub))
//	record with a members key: 'P' 2, the same fields, then
//	        base(key, count) left(n, n×sub)
//	cursor: 'C' 1 table state floor streams(…) above(n, n×(gap to the previous))
//
// Format 2 (members.go) lists in members only the subscriptions its
// members key does not say (not in it, or live from above the floor) and
// in left the key's names that are no longer members. A record without a
// members key is written in format 1, byte for byte as before it, and
// both formats are read: records written before format 2 existed, by the
// migration or by an earlier version, decode as they did.

// ErrCorrupt is returned (wrapped, naming the key and what is wrong) for a
// stored record or cursor that cannot be decoded: it is never taken for an
// empty one, which would send the partition's whole history again.
var ErrCorrupt = errors.New("position: a stored record or cursor cannot be decoded")

// formatVersion is the cursor's format and the record's without a
// Members key; formatMembers the record's with one.
const (
	formatVersion = 1
	formatMembers = 2
)

// encoder appends a record or cursor to b.
type encoder struct {
	b       []byte
	names   map[string]uint64 // the table: a name's index once written
	scratch []indexed
}

// indexed is an entry with its name's index in the table.
type indexed struct {
	i uint64
	e Entry
}

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) name(s string) { e.uint(e.names[s]) }
func (e *encoder) add(s string)  { e.names[s] = 0 }
func (e *encoder) str(s string) {
	e.uint(uint64(len(s)))
	e.b = append(e.b, s...)
}

// table writes the names added, sorted, and indexes them.
func (e *encoder) table() {
	e.uint(uint64(len(e.names)))
	for i, s := range slices.Sorted(maps.Keys(e.names)) {
		e.names[s] = uint64(i)
		e.str(s)
	}
}

// entries writes m, its sequences relative to floor, in name order (the
// table's).
func (e *encoder) entries(m map[string]Entry, floor uint64) {
	e.uint(uint64(len(m)))
	e.scratch = e.scratch[:0]
	for k, v := range m {
		e.scratch = append(e.scratch, indexed{e.names[k], v})
	}
	slices.SortFunc(e.scratch, func(a, b indexed) int { return cmp.Compare(a.i, b.i) })
	for _, x := range e.scratch {
		e.uint(x.i)
		e.uint(x.e.Seq - floor)
		e.uint(x.e.Version)
	}
}

// Encode returns r's bytes without a members key (format 1); r must be
// normalised (entries above the floor).
func (r *Record) Encode() []byte { return r.EncodeOn(nil) }

// EncodeOn returns r's bytes written against members key b: format 2,
// listing only the members b does not say; format 1 when b is nil. r
// must be normalised.
func (r *Record) EncodeOn(b *Members) []byte {
	listed, left, _ := Split(r, b)
	return r.EncodeSplit(b, listed, left)
}

// EncodeSplit is EncodeOn with split's result (it sorts listed and
// left).
func (r *Record) EncodeSplit(b *Members, listed, left []string) []byte {
	slices.Sort(listed)
	slices.Sort(left)
	e := encoder{names: make(map[string]uint64, len(r.Streams)+len(listed)+len(left)+8)}
	entries := len(r.Streams)
	for k := range r.Streams {
		e.add(k)
	}
	for sub, own := range r.Ahead {
		e.add(sub)
		entries += len(own)
		for k := range own {
			e.add(k)
		}
	}
	for _, sub := range listed {
		e.add(sub)
	}
	for _, sub := range left {
		e.add(sub)
	}
	for _, a := range r.Asides {
		e.add(a.Sub)
		e.add(a.Stream)
		e.add(a.State)
	}
	for _, t := range r.Retries {
		e.add(t.Sub)
	}
	for _, d := range r.Detached {
		for _, sub := range d.Subs {
			e.add(sub)
		}
	}
	e.b = make([]byte, 0, 64+16*len(e.names)+8*(entries+len(listed)+len(r.Asides)+len(r.Retries)))
	if b == nil {
		e.b = append(e.b, 'P', formatVersion)
	} else {
		e.b = append(e.b, 'P', formatMembers)
	}
	e.str(r.Owner)
	e.str(r.Claim)
	e.uint(r.Epoch)
	e.uint(uint64(r.Created))
	e.uint(r.Floor)
	e.table()
	e.entries(r.Streams, r.Floor)
	e.uint(uint64(len(r.Ahead)))
	for _, sub := range slices.Sorted(maps.Keys(r.Ahead)) {
		e.name(sub)
		e.entries(r.Ahead[sub], r.Floor)
	}
	e.uint(uint64(len(listed)))
	for _, sub := range listed {
		e.name(sub)
		e.uint(r.Members[sub])
	}
	e.uint(uint64(len(r.Asides)))
	for _, a := range r.Asides {
		e.name(a.Sub)
		e.name(a.Stream)
		e.uint(a.From)
		e.name(a.State)
	}
	e.uint(uint64(len(r.Retries)))
	for _, t := range r.Retries {
		e.name(t.Sub)
		e.uint(t.Seq)
		e.uint(t.Attempts)
	}
	e.uint(uint64(len(r.Detached)))
	for _, d := range r.Detached {
		e.uint(d.From)
		e.uint(uint64(len(d.Subs)))
		for _, sub := range d.Subs {
			e.name(sub)
		}
	}
	if b != nil {
		e.str(b.Key)
		e.uint(uint64(len(b.Names)))
		e.uint(uint64(len(left)))
		for _, sub := range left {
			e.name(sub)
		}
	}
	return e.b
}

// Encode returns c's bytes.
func (c *Cursor) Encode() []byte {
	e := encoder{names: map[string]uint64{c.State: 0}, b: make([]byte, 0, 32+24*len(c.Streams)+4*len(c.Above))}
	for k := range c.Streams {
		e.add(k)
	}
	e.b = append(e.b, 'C', formatVersion)
	e.table()
	e.name(c.State)
	e.uint(c.Floor)
	e.entries(c.Streams, c.Floor)
	e.uint(uint64(len(c.Above)))
	last := c.Floor
	for _, s := range c.Above {
		e.uint(s - last)
		last = s
	}
	return e.b
}

// decoder reads what encoder wrote; the first problem sticks in err.
type decoder struct {
	b     []byte
	names []string
	err   error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = errors.New(what)
	}
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong integer")
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length, refusing one longer than the bytes left (each
// item takes one byte at least).
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail("count past the end")
		d.b = nil
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.count()
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) name() string {
	i := d.uint()
	if i >= uint64(len(d.names)) {
		d.fail("name index out of the table")
		return ""
	}
	return d.names[i]
}

// header reads the kind and the format, one of formats.
func (d *decoder) header(kind byte, formats ...byte) byte {
	if len(d.b) < 2 || d.b[0] != kind || !slices.Contains(formats, d.b[1]) {
		d.fail("not an encoding of this kind in a known format")
		d.b = nil
		return 0
	}
	f := d.b[1]
	d.b = d.b[2:]
	return f
}

func (d *decoder) table() {
	d.names = make([]string, d.count())
	for i := range d.names {
		d.names[i] = d.str()
	}
}

func (d *decoder) entries(floor uint64) map[string]Entry {
	n := d.count()
	if n == 0 {
		return nil
	}
	m := make(map[string]Entry, n)
	for range n {
		k := d.name()
		m[k] = Entry{Seq: floor + d.uint(), Version: d.uint()}
	}
	return m
}

// end reports d's error, or one for bytes left over.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("bytes left after the end")
	}
	if d.err != nil {
		return errors.Join(ErrCorrupt, d.err)
	}
	return nil
}

// DecodeRecordRef reads a record from b, in either format. For format 2,
// Members holds only the members the record lists, and ref names the
// Members key that completes it (WithBase); for format 1 ref is zero.
func DecodeRecordRef(b []byte) (r Record, ref BaseRef, err error) {
	d := decoder{b: b}
	format := d.header('P', formatVersion, formatMembers)
	r.Owner, r.Claim = d.str(), d.str()
	r.Epoch, r.Created, r.Floor = d.uint(), int64(d.uint()), d.uint()
	d.table()
	r.Streams = d.entries(r.Floor)
	if n := d.count(); n > 0 {
		r.Ahead = make(map[string]map[string]Entry, n)
		for range n {
			sub := d.name()
			r.Ahead[sub] = d.entries(r.Floor)
		}
	}
	if n := d.count(); n > 0 {
		r.Members = make(map[string]uint64, n)
		for range n {
			sub := d.name()
			r.Members[sub] = d.uint()
		}
	}
	for range d.count() {
		r.Asides = append(r.Asides, Aside{Sub: d.name(), Stream: d.name(), From: d.uint(), State: d.name()})
	}
	for range d.count() {
		r.Retries = append(r.Retries, Retry{Sub: d.name(), Seq: d.uint(), Attempts: d.uint()})
	}
	for range d.count() {
		g := Detached{From: d.uint()}
		for range d.count() {
			g.Subs = append(g.Subs, d.name())
		}
		r.Detached = append(r.Detached, g)
	}
	if format == formatMembers {
		ref.Key, ref.Count = d.str(), d.uint()
		for range d.count() {
			ref.Left = append(ref.Left, d.name())
		}
		if ref.Key == "" {
			d.fail("a format 2 record names no members key")
		}
	}
	return r, ref, d.end()
}

// DecodeCursor reads a cursor from b.
func DecodeCursor(b []byte) (Cursor, error) {
	d := decoder{b: b}
	d.header('C', formatVersion)
	d.table()
	var c Cursor
	c.State, c.Floor = d.name(), d.uint()
	c.Streams = d.entries(c.Floor)
	last := c.Floor
	for range d.count() {
		last += d.uint()
		c.Above = append(c.Above, last)
	}
	return c, d.end()
}
