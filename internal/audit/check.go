// The comparison of one stream, a pure function of what JetStream stores
// and the events Postgres holds.

package audit

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/jsbridge/jsbridge/event"
)

// stored is what an audit keeps of one JetStream message of a stream.
type stored struct {
	seq     uint64 // JetStream stream sequence
	version int64  // ce-streamversion; -1 when absent or unreadable
	id      string // Nats-Msg-Id
	subject string
	sums    sums
}

// streamCheck compares one stream: built from the stream's messages in
// stored order, then told each event in version order.
type streamCheck struct {
	stream string
	first  map[int64]int // version -> index in msgs of its first copy
	msgs   []stored
	maxVer int64 // highest version stored (any, also past the watermark); -1: none
	minVer int64 // lowest version stored; -1: none
	ret    Retention
	// onSubject are the versions stored per subject, in stored order.
	onSubject map[string][]int64
	problems  []Problem
	agedOut   int64 // missing events the stream's limits removed
}

// newStreamCheck finds duplicates and out-of-order messages among msgs
// (in stored order) for versions from..through, the events under audit;
// ret tells a missing event aged out from lost.
func newStreamCheck(stream string, msgs []stored, from, through int64, ret Retention) *streamCheck {
	c := &streamCheck{stream: stream, first: make(map[int64]int, len(msgs)), msgs: msgs, maxVer: -1, minVer: -1, ret: ret}
	if ret.MaxMsgsPerSubject > 0 {
		c.onSubject = make(map[string][]int64)
	}
	for i, m := range msgs {
		v := m.version
		if v < 0 {
			continue
		}
		if c.minVer < 0 || v < c.minVer {
			c.minVer = v
		}
		if c.onSubject != nil {
			c.onSubject[m.subject] = append(c.onSubject[m.subject], v)
		}
		inAudit := v >= from && v <= through
		if _, seen := c.first[v]; seen {
			if inAudit {
				c.problems = append(c.problems, Problem{Stream: stream, Version: v, EventID: parseID(m.id), Kind: Duplicate, Sequence: m.seq,
					Detail: fmt.Sprintf("stored again at sequence %d (first at %d)", m.seq, msgs[c.first[v]].seq)})
			}
			continue
		}
		c.first[v] = i
		if v < c.maxVer && inAudit {
			c.problems = append(c.problems, Problem{Stream: stream, Version: v, EventID: parseID(m.id), Kind: OutOfOrder, Sequence: m.seq,
				Detail: fmt.Sprintf("stored after version %d", c.maxVer)})
		}
		c.maxVer = max(c.maxVer, v)
	}
	return c
}

// event compares e (from Postgres) with its first stored copy; want is
// the message the bridge publishes for e (forward.Message). A missing
// event the stream's limits removed is counted in agedOut, not reported.
func (c *streamCheck) event(e event.Event, want *nats.Msg) {
	i, ok := c.first[e.Version]
	if !ok && c.ret.agedOut(e.Version, e.Created, c.laterOn(want.Subject, e.Version), c.minVer) {
		c.agedOut++
		return
	}
	if !ok {
		p := Problem{Stream: c.stream, Version: e.Version, EventID: e.ID, Kind: Missing, Tail: e.Version > c.maxVer, ev: e}
		if p.Tail {
			p.Detail = "not in JetStream (tail: after every stored message of the stream)"
		} else {
			p.Detail = fmt.Sprintf("not in JetStream (hole: version %d is stored)", c.maxVer)
		}
		c.problems = append(c.problems, p)
		return
	}
	m := c.msgs[i]
	p := Problem{Stream: c.stream, Version: e.Version, EventID: e.ID, Kind: ContentDiffers, Sequence: m.seq}
	if e.Err != nil {
		p.Detail = fmt.Sprintf("the event cannot be read from Postgres: %v", e.Err)
		c.problems = append(c.problems, p)
		return
	}
	w := sumsOf(want.Subject, want.Header, want.Data)
	switch {
	case w.data != m.sums.data && w.meta != m.sums.meta:
		p.Detail = fmt.Sprintf("data (Postgres %d bytes, JetStream %d bytes) and subject or headers differ", w.dataLen, m.sums.dataLen)
	case w.data != m.sums.data:
		p.Detail = fmt.Sprintf("data differs (Postgres %d bytes, JetStream %d bytes)", w.dataLen, m.sums.dataLen)
	case w.meta != m.sums.meta:
		p.Detail = "subject or headers (Nats-Msg-Id, Content-Type, ce-*) differ"
	default:
		return
	}
	c.problems = append(c.problems, p)
}

// parseID reads an event id from a Nats-Msg-Id; 0 when it is not one.
func parseID(s string) int64 {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return id
}

// laterOn counts the versions after v stored on subject (only kept with a
// MaxMsgsPerSubject limit; 0 otherwise).
func (c *streamCheck) laterOn(subject string, v int64) int64 {
	var n int64
	for _, w := range c.onSubject[subject] {
		if w > v {
			n++
		}
	}
	return n
}
