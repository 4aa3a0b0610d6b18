package reader

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrCaughtUp is returned by Cursor.Next once every event of the
// cursor's filters from its start up to its target was handed on: the
// subscription may rejoin the reader from the target on (the design's
// "Rejoin"), or the caller raises the target with Extend and reads on.
var ErrCaughtUp = errors.New("cursor read every event up to its target")

// Cursor is a subscription's own read of the events stream while it is
// behind the reader (docs/design/next-engine.md, section 3, "Catching up
// without being re-sent what it had"): the events matching any of its
// subject filters from a start sequence up to a target, in stream order,
// each once, each with its partition (the caller keeps those of the
// partitions the replica owns). It reads by batched direct gets, one
// read per filter ({"seq": from, "next_by_subj": <filter>, "batch": n}:
// the server filters by subject, so a cursor reads its own events and
// nothing else), merged by sequence; an event two filters match is handed
// on once. A stream cursor is a Cursor of the one filter
// wire.StreamFilter(prefix, stream). A lagging replica's short answers
// are read again, then asked of the stream's leader (see the package
// doc): the target, the reader's head, is what tells a short answer from
// the end.
//
// A Cursor is not safe for concurrent use; cursors are independent of
// each other and of their Reader. It holds no server state: dropping it
// costs nothing.
type Cursor struct {
	get   direct
	scans []scan
	heads [][]Event // per scan: read, not yet handed on
	to    uint64
	last  uint64 // the last sequence handed on
}

// NewCursor makes a cursor of the events stream cfg names (its defaults
// as for Open) over filters, from sequence from (1 or more) up to target
// to, on js. It fails with ErrInvalidConfig for an invalid cfg, no
// filter, a filter that is not a valid subject filter, or from 0.
// Nothing is read before Next.
func NewCursor(js jetstream.JetStream, cfg Config, filters []string, from, to uint64) (*Cursor, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream context is nil", ErrInvalidConfig)
	}
	if from < 1 {
		return nil, fmt.Errorf("%w: cursor start sequence %d: want 1 or more", ErrInvalidConfig, from)
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("%w: cursor filters: none given", ErrInvalidConfig)
	}
	c := &Cursor{get: direct{js: js, cfg: cfg}, to: to, last: from - 1,
		scans: make([]scan, len(filters)), heads: make([][]Event, len(filters))}
	for i, f := range filters {
		if !validFilter(f) {
			return nil, fmt.Errorf("%w: cursor filters[%d] %q: not a subject filter (tokens of [^ .*>], or * for one token, > for the rest)",
				ErrInvalidConfig, i, f)
		}
		c.scans[i] = scan{filter: f, next: from}
	}
	return c, nil
}

// Target returns the last sequence the cursor reads up to.
func (c *Cursor) Target() uint64 { return c.to }

// Extend raises the cursor's target to to (a lower one changes nothing):
// the reader's head moved on while the cursor read, and Next reads on
// from where it was.
func (c *Cursor) Extend(to uint64) { c.to = max(c.to, to) }

// Next returns the cursor's next event: the one of lowest sequence above
// the last it returned that one of its filters matches, at or below its
// target. It returns ErrCaughtUp once there is none (Extend, then Next
// again, reads on); an error wrapping ErrBehind or ErrNoDirectGet when
// the stream could not be read up to the target (the cursor stays where
// it was: Next again retries); or ctx's error. Subjects of no event (not
// three tokens after the prefix) are passed over.
func (c *Cursor) Next(ctx context.Context) (Event, error) {
	for {
		best := -1
		for i := range c.scans {
			for len(c.heads[i]) == 0 && c.scans[i].next <= c.to {
				evs, err := c.get.read(ctx, &c.scans[i], c.to)
				if err != nil {
					return Event{}, err
				}
				c.heads[i] = evs
			}
			if len(c.heads[i]) > 0 && (best < 0 || c.heads[i][0].Seq < c.heads[best][0].Seq) {
				best = i
			}
		}
		if best < 0 {
			return Event{}, ErrCaughtUp
		}
		ev := c.heads[best][0]
		c.heads[best] = c.heads[best][1:]
		if ev.Seq <= c.last {
			continue // another filter matched it too, and it went
		}
		c.last = ev.Seq
		return ev, nil
	}
}

// validFilter reports whether f is a NATS subject filter: tokens
// separated by dots, none empty, with "*" only as a whole token and ">"
// only as the whole last one, and no whitespace.
func validFilter(f string) bool {
	if f == "" || strings.ContainsAny(f, " \t\r\n") {
		return false
	}
	tokens := strings.Split(f, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return false
		case t == ">":
			if i != len(tokens)-1 {
				return false
			}
		case t == "*":
		case strings.ContainsAny(t, "*>"):
			return false
		}
	}
	return true
}
