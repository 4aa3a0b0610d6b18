// Package record is the values of the shared engine's positions bucket
// and their rules, without I/O (docs/design/next-engine.md, D4 and D6):
// a partition's Record (its floor, what is settled above it per stream
// and per subscription, members, asides, retries, detached groups), a
// subscription's Cursor while it is not live, what each Covers, and
// their binary encoding (encoding.go) with the members key's (Members:
// the names of a record's members written apart once there are many,
// members.go). Package position claims, commits and reads them in the
// bucket; it names these types for its callers.
package record

import (
	"maps"
	"slices"
)

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
	Seq     uint64 `json:"seq"`     // the event's events stream sequence
	Version uint64 `json:"version"` // its stream version (NoVersion: none)
}

// Aside is one stream of one subscription set aside (stuck, parked,
// or read again: fanout.AsideStuck, AsideParked, AsideReading; an
// order-stuck head parks its stream): its events from From (an events
// stream sequence) on are not dispatched to the subscription until it
// is re-read.
type Aside struct {
	Sub    string `json:"subscription"` // the subscription's name
	Stream string `json:"stream"`       // the stream (wire.StreamKey)
	From   uint64 `json:"from"`         // the first sequence set aside
	State  string `json:"state"`        // "stuck", "parked", "behind"
}

// Retry carries the failed attempts at one event (Seq) of a subscription
// across owners; for an unordered subscription it also lets the floor
// pass the event.
type Retry struct {
	Sub      string `json:"subscription"` // the subscription's name
	Seq      uint64 `json:"seq"`          // the event's sequence
	Attempts uint64 `json:"attempts"`     // the attempts that failed so far
}

// Detached is a group of subscriptions given cursors in one commit whose
// own cursor keys are not written yet (a mass outage): their events above
// From are covered by the group until their keys are.
type Detached struct {
	From uint64   `json:"from"`          // the group covers its events above From
	Subs []string `json:"subscriptions"` // the subscriptions' names
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
	// writes their names once in a members key (position.MembersKey), and the
	// record's commits after it list only the members that key does not
	// say (joined since, or live from above the floor) and the names in
	// it that left; a new key is written when those reach 64 plus a 16th
	// of its names. position.Claim and ReadAll read the key back, so Members
	// always holds every member. A member's value can therefore not keep
	// a position below the floor: a subscription whose events the floor
	// must not pass needs a cursor, an aside or a retry entry.
	Members map[string]uint64 `json:"members,omitempty"`
	// Asides are the streams set aside, per subscription; Retries the
	// events with failed attempts; Detached the groups given cursors
	// whose keys are not written yet.
	Asides   []Aside    `json:"asides,omitempty"`
	Retries  []Retry    `json:"retries,omitempty"`
	Detached []Detached `json:"detached,omitempty"`
}

// Covers reports whether the record says subscription sub settled the
// event at seq of stream: the stream's entry, sub's own entry for it, or
// at or below the floor or sub's member entry, unless the stream is set
// aside for sub from seq or before (the floor passes an aside's events
// unsettled: the aside covers them, R1).
func (r Record) Covers(sub, stream string, seq uint64) bool {
	return r.CoversFrom(sub, stream, seq, r.Members[sub])
}

// CoversFrom is Covers with sub's member entry from (0: none).
func (r *Record) CoversFrom(sub, stream string, seq, from uint64) bool {
	if seq <= r.Streams[stream].Seq || seq <= r.Ahead[sub][stream].Seq {
		return true
	}
	return (seq <= r.Floor || seq <= from) && !r.AsideHolds(sub, stream, seq)
}

// AsideHolds reports whether stream is set aside for sub at seq.
func (r *Record) AsideHolds(sub, stream string, seq uint64) bool {
	for _, a := range r.Asides {
		if a.Sub == sub && a.Stream == stream && a.From <= seq {
			return true
		}
	}
	return false
}

// Normalise drops the entries the floor, the shared stream entries or a
// member entry already cover (not those of a stream set aside), and the
// empty maps.
func (r *Record) Normalise() {
	maps.DeleteFunc(r.Streams, func(_ string, e Entry) bool { return e.Seq <= r.Floor })
	for sub, own := range r.Ahead {
		maps.DeleteFunc(own, func(k string, e Entry) bool {
			// An aside's entries stay: the floor does not cover them.
			return e.Seq <= max(r.Floor, r.Streams[k].Seq, r.Members[sub]) && !r.AsideHolds(sub, k, e.Seq)
		})
		if len(own) == 0 {
			delete(r.Ahead, sub)
		}
	}
}

// Clone returns a deep copy of r.
func (r *Record) Clone() Record {
	c := r.CloneExceptMembers()
	c.Members = maps.Clone(r.Members)
	return c
}

// CloneExceptMembers returns a deep copy of r without its members.
func (r *Record) CloneExceptMembers() Record {
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
// rejoins only from Top or above (position.Partition.Rejoin).
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

// Normalise drops what the floor covers from c and sorts Above.
func (c *Cursor) Normalise() {
	maps.DeleteFunc(c.Streams, func(_ string, e Entry) bool { return e.Seq <= c.Floor })
	slices.Sort(c.Above)
	c.Above = slices.Compact(slices.DeleteFunc(c.Above, func(s uint64) bool { return s <= c.Floor }))
}

// Clone returns a deep copy of c.
func (c *Cursor) Clone() Cursor {
	d := *c
	d.Streams, d.Above = maps.Clone(c.Streams), slices.Clone(c.Above)
	return d
}
