package fanout

import (
	"sort"

	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
)

// window is what holds the partition's floor back (the design's R1): the
// events dispatched above the floor, each with the count of live
// subscriptions that hold it and have not settled it. The floor is the
// first event still owed, minus one, or the last event dispatched when
// nothing is owed.
type window struct {
	q    []slot // ascending by seq; the first is owed
	last uint64 // the last event dispatched
}

type slot struct {
	seq     uint64
	subject string
	owe     int
}

// add records the event at seq (after every one added before), owed by
// owe subscriptions. An event owed by none with nothing owed before it
// is kept only by last.
func (w *window) add(seq uint64, subject string, owe int) {
	w.last = seq
	if owe > 0 || len(w.q) > 0 {
		w.q = append(w.q, slot{seq: seq, subject: subject, owe: owe})
	}
}

// done records that one of the subscriptions owing seq settled it (or
// stopped holding it: a cursor covers it).
func (w *window) done(seq uint64) {
	i := sort.Search(len(w.q), func(i int) bool { return w.q[i].seq >= seq })
	if i < len(w.q) && w.q[i].seq == seq && w.q[i].owe > 0 {
		w.q[i].owe--
	}
}

// floor drops the settled events at the start and returns the floor.
func (w *window) floor() uint64 {
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

// settledBy returns the events above the floor that m takes and does not
// hold (settled, or not dispatched to it because the record covered
// them): an unordered subscription's cursor's Above at a detach.
func (w *window) settledBy(m *member.Entry, inHand map[uint64]bool) []uint64 {
	var out []uint64
	for _, s := range w.q {
		if _, held := inHand[s.seq]; !held && m.Takes(s.subject) {
			out = append(out, s.seq)
		}
	}
	return out
}
