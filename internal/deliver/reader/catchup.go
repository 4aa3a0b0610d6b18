package reader

import "context"

// catchUp is the read that brings the partitions taken below the
// reader's head up to it: for each such partition p, the events of p in
// (after[p], to], read by batched direct gets of every event by sequence
// (the partition is not in the subject, so the server cannot narrow the
// read to it, and a subject filter, next_by_subj, cost about three times
// as much per event: the design's E7), a lagging replica's short answers
// made good by the stream's leader (direct.read). The reader reads
// nothing live while it runs, so to, its head when the catch-up began,
// stays its head until the catch-up ends, and every partition caught up
// then goes live from to + 1.
type catchUp struct {
	after   map[int]uint64 // partition → last sequence handed on (its floor at first)
	scan    scan           // every subject, from the lowest floor + 1
	to      uint64         // the last sequence to read
	pending []Event        // read, not yet handed on
}

// add puts partition p, whose events up to floor are settled, into the
// catch-up up to head.
func (c *catchUp) add(p int, floor, head uint64) {
	if len(c.after) == 0 {
		c.after, c.pending = map[int]uint64{}, nil
		c.scan, c.to = scan{next: floor + 1}, head
	}
	c.after[p] = floor
	// A partition with a lower floor reads again from there; the others
	// skip what they were already handed (after).
	if floor+1 < c.scan.next {
		c.scan = scan{next: floor + 1}
	}
	c.to = max(c.to, head)
}

// drop takes partition p out of the catch-up.
func (c *catchUp) drop(p int) { delete(c.after, p) }

// nextCaughtUp returns the next event the catch-up hands on, reading a
// batch when none is pending; ok is false once no catch-up runs (any
// that ran has ended, its partitions live).
func (r *Reader) nextCaughtUp(ctx context.Context) (ev Event, ok bool, err error) {
	c := &r.catch
	for len(c.after) > 0 {
		for len(c.pending) > 0 {
			ev, c.pending = c.pending[0], c.pending[1:]
			if a, taken := c.after[ev.Partition]; taken && ev.Seq > a {
				c.after[ev.Partition] = ev.Seq
				return ev, true, nil
			}
		}
		if c.scan.next > c.to {
			c.after = nil
			return Event{}, false, nil
		}
		if c.pending, err = r.get.read(ctx, &c.scan, c.to); err != nil {
			return Event{}, false, err
		}
	}
	return Event{}, false, nil
}
