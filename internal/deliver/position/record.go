// Package position keeps where every subscription stands on one
// partition, in a key-value record the partition's owner writes itself
// (docs/design/next-engine.md, D4 and D6, stage 2): the record
// pos.p<N> (Record), a cursor key cur.<subscription>.p<N> (Cursor) for a
// subscription that left the shared read, a members key
// mem.p<N>.<claim>.<n> holding the names of the record's members once
// there are many (written before the record that names it, once, so that
// a commit does not write every member again: MembersKey), the claim
// that makes a former owner's writes fail (Claim, ErrLost),
// compare-and-set commits that linger and coalesce (Partition.Run), and
// the write-before-next waiters (Partition.Wait).
//
// The rules it keeps (the design's R2–R4):
//   - write before next: Wait returns only once a commit whose record (or
//     cursor) covers the settlement succeeded, so a lane sends a stream's
//     next version only then;
//   - one writer: every commit is a compare-and-set on the revision this
//     claim last wrote, and carries the claim's token; a claim rewrites
//     the record before the new owner reads anything else, so a former
//     owner's commit after it fails (ErrLost). A refusal is read from the
//     bucket's stream leader before it is believed: a record that still
//     carries this claim's token means an earlier write landed with its
//     answer lost (or the server refused spuriously), and the commit goes
//     again from the revision found;
//   - cursors first: a cursor key is written before the commit that drops
//     its subscription from the record's members, and a cursor key whose
//     subscription the record still lists as a member is stale (a commit
//     that never landed, or a former owner's) and is dropped at the claim.
//     Every commit writes the record after its cursor keys, and waiters
//     are released only once both succeeded: the record's compare-and-set
//     fences the cursor keys too.
//
// The package does not decide the floor, the members or when a
// subscription falls behind: the owner's dispatcher does, through
// Partition.Edit, Detach, Start and Rejoin. It is not wired into the
// engine yet.
package position

import (
	"maps"
	"slices"
	"strconv"
	"time"
)

// Defaults of Config and of the bucket.
const (
	// DefaultBucket is the key-value bucket of the position records and
	// cursor keys (no TTL, history 1).
	DefaultBucket = "jsbridge_positions"
	// DefaultLinger bounds how long a settlement waits for its commit
	// when no waiter wants it sooner: commits coalesce within it.
	DefaultLinger = 200 * time.Millisecond
	// DefaultMaxSize caps an encoded record, in bytes (a KV value may be
	// 1 MiB): past it, the subscription with the most entries of its own
	// is given a cursor (Partition.Detach) before the commit.
	DefaultMaxSize = 256 << 10
)

// Key is partition p's record key: "pos.p<p>".
func Key(p int) string { return "pos.p" + strconv.Itoa(p) }

// CursorKey is the cursor key of subscription sub on partition p:
// "cur.<sub>.p<p>" (subscription names are [A-Za-z0-9_-]+, valid key
// tokens).
func CursorKey(sub string, p int) string { return "cur." + sub + ".p" + strconv.Itoa(p) }

// cursorFilter matches every cursor key of partition p.
func cursorFilter(p int) string { return "cur.*.p" + strconv.Itoa(p) }

// NoVersion is an Entry's Version that names no predecessor: the stream's
// settled events above the floor were all dead-lettered before any was
// delivered, so its next event's Jsbridge-Previous-Version is the one
// before them (or none). Versions are otherwise a stream's own, from 0.
const NoVersion = ^uint64(0)

// Entry is the last event of one stream settled (answered 2xx or
// dead-lettered): its sequence in the events stream and its stream
// version, which names the version chain's predecessor of the stream's
// next event without a look-up.
type Entry struct {
	Seq     uint64 `json:"seq"`
	Version uint64 `json:"version"`
}

// Aside is one stream of one subscription set aside (stuck, parked,
// order-stuck): its events from From (an events stream sequence) on are
// not dispatched to the subscription until it is re-read.
type Aside struct {
	Sub    string `json:"subscription"`
	Stream string `json:"stream"`
	From   uint64 `json:"from"`
	State  string `json:"state"` // "stuck", "parked", "order-stuck"
}

// Retry carries the failed attempts at one event (Seq) of a subscription
// across owners; for an unordered subscription it also lets the floor
// pass the event.
type Retry struct {
	Sub      string `json:"subscription"`
	Seq      uint64 `json:"seq"`
	Attempts uint64 `json:"attempts"`
}

// Detached is a group of subscriptions given cursors in one commit whose
// own cursor keys are not written yet (a mass outage): their events above
// From are covered by the group until their keys are.
type Detached struct {
	From uint64   `json:"from"`
	Subs []string `json:"subscriptions"`
}

// Record is partition N's position record, stored under Key(N).
// Sequences are the events stream's. The zero value is the record of a
// partition nobody claimed yet: everything is read from the start.
type Record struct {
	// Owner is the replica that wrote it; Claim the token its claim drew
	// (unique to that claim); Epoch the claim's lease epoch.
	Owner string `json:"owner,omitempty"`
	Claim string `json:"claim,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	// Created is the creation time of the events stream whose sequences
	// the record holds (Unix nanoseconds; 0: unknown): a record of a
	// stream deleted and made again (its sequences start again) is not
	// read.
	Created int64 `json:"created,omitempty"`
	// Floor: every event of the partition at or below it was settled for
	// every live subscription that takes it, or is covered by an aside, a
	// retry, a detached group or a cursor.
	Floor uint64 `json:"floor"`
	// Streams maps a stream to its last event settled by every live
	// subscription that takes it, above Floor.
	Streams map[string]Entry `json:"streams,omitempty"`
	// Ahead maps a subscription to the streams it settled further than
	// Streams says, above Floor.
	Ahead map[string]map[string]Entry `json:"ahead,omitempty"`
	// Members maps a live subscription to the sequence from which it is
	// live on the partition (joined, or rejoined after a cursor): every
	// event of it at or below was settled, or is not for it.
	//
	// A name's presence is what says the subscription joined the
	// partition (fanout's Join leaves a member as it is, so that a new
	// owner never starts it again from its start); its value speaks only
	// while it is above Floor: a value at or below Floor says what Floor
	// says, and a record read back gives such a member Floor (or the
	// value it was written with). Members live at the floor are not
	// written with every commit: once a record has 64 of them, a commit
	// writes their names once in a members key (MembersKey), and the
	// record's commits after it list only the members that key does not
	// say (joined since, or live from above the floor) and the names in
	// it that left; a new key is written when those reach 64 plus a 16th
	// of its names. Claim and ReadAll read the key back, so Members
	// always holds every member. A member's value can therefore not keep
	// a position below the floor: a subscription whose events the floor
	// must not pass needs a cursor, an aside or a retry entry.
	Members  map[string]uint64 `json:"members,omitempty"`
	Asides   []Aside           `json:"asides,omitempty"`
	Retries  []Retry           `json:"retries,omitempty"`
	Detached []Detached        `json:"detached,omitempty"`
}

// Covers reports whether the record says subscription sub settled the
// event at seq of stream: the stream's entry, sub's own entry for it, or
// at or below the floor or sub's member entry, unless the stream is set
// aside for sub from seq or before (the floor passes an aside's events
// unsettled: the aside covers them, R1).
func (r Record) Covers(sub, stream string, seq uint64) bool {
	return r.coversFrom(sub, stream, seq, r.Members[sub])
}

// coversFrom is Covers with sub's member entry from (0: none).
func (r *Record) coversFrom(sub, stream string, seq, from uint64) bool {
	if seq <= r.Streams[stream].Seq || seq <= r.Ahead[sub][stream].Seq {
		return true
	}
	return (seq <= r.Floor || seq <= from) && !r.asideHolds(sub, stream, seq)
}

// asideHolds reports whether stream is set aside for sub at seq.
func (r *Record) asideHolds(sub, stream string, seq uint64) bool {
	for _, a := range r.Asides {
		if a.Sub == sub && a.Stream == stream && a.From <= seq {
			return true
		}
	}
	return false
}

// normalise drops the entries the floor, the shared stream entries or a
// member entry already cover (not those of a stream set aside), and the
// empty maps.
func (r *Record) normalise() {
	maps.DeleteFunc(r.Streams, func(_ string, e Entry) bool { return e.Seq <= r.Floor })
	for sub, own := range r.Ahead {
		maps.DeleteFunc(own, func(k string, e Entry) bool {
			// An aside's entries stay: the floor does not cover them.
			return e.Seq <= max(r.Floor, r.Streams[k].Seq, r.Members[sub]) && !r.asideHolds(sub, k, e.Seq)
		})
		if len(own) == 0 {
			delete(r.Ahead, sub)
		}
	}
}

// clone returns a deep copy of r.
func (r *Record) clone() Record {
	c := r.cloneExceptMembers()
	c.Members = maps.Clone(r.Members)
	return c
}

// cloneExceptMembers returns a deep copy of r without its members.
func (r *Record) cloneExceptMembers() Record {
	c := *r
	c.Streams = maps.Clone(r.Streams)
	c.Members = nil
	c.Ahead = make(map[string]map[string]Entry, len(r.Ahead))
	for sub, own := range r.Ahead {
		c.Ahead[sub] = maps.Clone(own)
	}
	c.Asides, c.Retries = slices.Clone(r.Asides), slices.Clone(r.Retries)
	c.Detached = make([]Detached, len(r.Detached))
	for i, d := range r.Detached {
		c.Detached[i] = Detached{From: d.From, Subs: slices.Clone(d.Subs)}
	}
	return c
}

// Cursor is where one subscription stands on a partition while it is not
// live (behind, its breaker open, disabled, paused, throttled, new with a
// start position), stored under CursorKey(sub, N).
type Cursor struct {
	// State says why it is not live: "behind", "breaker", "disabled",
	// "paused", "throttled", "held" (a subscription the owner does not
	// deliver: its place kept for a replica that does).
	State string `json:"state"`
	// Floor: every event of the partition the subscription takes at or
	// below it was settled, but for the streams the record sets aside
	// for it (Record.Asides: the floor passes an aside's events
	// unsettled, as the record's does); its read goes on from Floor+1.
	Floor uint64 `json:"floor"`
	// Streams: per stream, the last event settled above Floor (an
	// ordered subscription).
	Streams map[string]Entry `json:"streams,omitempty"`
	// Above: events settled above Floor, ascending (an unordered one).
	Above []uint64 `json:"above,omitempty"`
}

// Covers reports whether the cursor says the event at seq of stream was
// settled. Its floor does not speak for a stream the record sets aside
// for the subscription (see Floor): a caller checks the record's asides.
func (c Cursor) Covers(stream string, seq uint64) bool {
	_, found := slices.BinarySearch(c.Above, seq)
	return seq <= c.Floor || seq <= c.Streams[stream].Seq || found
}

// Top is the highest sequence c says settled: its Floor, its last Above
// entry or its highest stream entry. A live read from a head below it
// would send the events between them that c covers again, so a cursor
// rejoins only from Top or above (Partition.Rejoin).
func (c Cursor) Top() uint64 {
	top := c.Floor
	for _, s := range c.Above {
		top = max(top, s)
	}
	for _, e := range c.Streams {
		top = max(top, e.Seq)
	}
	return top
}

// normalise drops what the floor covers from c and sorts Above.
func (c *Cursor) normalise() {
	maps.DeleteFunc(c.Streams, func(_ string, e Entry) bool { return e.Seq <= c.Floor })
	slices.Sort(c.Above)
	c.Above = slices.Compact(slices.DeleteFunc(c.Above, func(s uint64) bool { return s <= c.Floor }))
}

// clone returns a deep copy of c.
func (c *Cursor) clone() Cursor {
	d := *c
	d.Streams, d.Above = maps.Clone(c.Streams), slices.Clone(c.Above)
	return d
}

// raise sets m[k] to e unless it holds a later event already.
func raise(m map[string]Entry, k string, e Entry) {
	if e.Seq > m[k].Seq {
		m[k] = e
	}
}
