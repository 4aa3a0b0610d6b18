// Package floor is what holds a partition's floor back in the shared
// engine's fan-out (docs/design/next-engine.md, R1): the events
// dispatched above the floor, each with the count of live subscriptions
// that hold it and have not settled it (Window). The floor is the first
// event still owed, minus one, or the last event dispatched when nothing
// is owed. Values only: the fan-out (internal/deliver/fanout) keeps one
// per partition under its lock and writes the floor it gives.
package floor

import (
	"sort"
)

// Window is the events dispatched above a partition's floor and who
// owes them. Not safe for concurrent use. Make one with New.
type Window struct {
	q    []slot // ascending by seq; the first is owed
	last uint64 // the last event dispatched
}

// New returns the window of a partition whose floor is floor, nothing
// dispatched above it yet.
func New(floor uint64) Window { return Window{last: floor} }

type slot struct {
	seq     uint64
	subject string
	owe     int
}

// Add records the event at seq (after every one added before), owed by
// owe subscriptions. An event owed by none with nothing owed before it
// is kept only as the last one dispatched.
func (w *Window) Add(seq uint64, subject string, owe int) {
	w.last = seq
	if owe > 0 || len(w.q) > 0 {
		w.q = append(w.q, slot{seq: seq, subject: subject, owe: owe})
	}
}

// Done records that one of the subscriptions owing seq settled it (or
// stopped holding it: a cursor covers it). An event not in the window,
// or owed by none, is left as it is.
func (w *Window) Done(seq uint64) {
	i := sort.Search(len(w.q), func(i int) bool { return w.q[i].seq >= seq })
	if i < len(w.q) && w.q[i].seq == seq && w.q[i].owe > 0 {
		w.q[i].owe--
	}
}

// Floor drops the settled events at the start and returns the floor.
func (w *Window) Floor() uint64 {
	i := 0
	for i < len(w.q) && w.q[i].owe == 0 {
		i++
	}
	if i > 0 {
		clear(w.q[:i])
		w.q = w.q[i:]
	}
	if len(w.q) == 0 {
		return w.last
	}
	return w.q[0].seq - 1
}

// SettledBy returns the events above the floor whose subject takes
// reports and that inHand does not hold (settled, or not dispatched to
// the subscription because the record covered them): an unordered
// subscription's cursor's Above at a detach.
func (w *Window) SettledBy(takes func(subject string) bool, inHand map[uint64]bool) []uint64 {
	var out []uint64
	for _, s := range w.q {
		if _, held := inHand[s.seq]; !held && takes(s.subject) {
			out = append(out, s.seq)
		}
	}
	return out
}
