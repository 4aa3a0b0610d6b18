package reader

import "context"

// catchUp is the read that brings the partitions taken below the
// reader's head up to it: for each such partition p, the events of p in
// (after[p], to], read by batched direct gets of every event by sequence
// (the partition is not in the subject, so the server cannot narrow the
// read to it, and a subject filter, next_by_subj, cost about three times
// as much per event: the design's E7), a lagging replica's short answers
// made good by the stream's leader (direct.read). Between its batches
// the reader reads live (turn): the live partitions' events are handed
// on, and a caught-up partition's event read live moves to, the
// catch-up's target, past it, so that the catch-up hands it on in its
// order. When the catch-up reaches to, no event of its partitions lies
// between to and the head, and they go live from the head on.
type catchUp struct {
	after   map[int]uint64 // partition → last sequence handed on (its floor at first)
	scan    scan           // every subject, from the lowest floor + 1
	to      uint64         // the last sequence to read
	pending []Event        // read, not yet handed on
	turn    int            // live messages Next may read before the next batch
}

// add puts partition p, whose events up to floor are settled, into the
// catch-up up to head.
func (c *catchUp) add(p int, floor, head uint64) {
	if len(c.after) == 0 {
		c.after, c.pending, c.turn = map[int]uint64{}, nil, 0
		c.scan, c.to = scan{next: floor + 1}, head
	}
	c.after[p] = floor
	// A partition with a lower floor reads again from there; the others
	// skip what they were already handed (after). The batch at hand goes
	// too: handed on first, its events of p would carry p past its events
	// between floor and the batch, which the read again then skips. So
	// the read again starts no later than the batch's first event not
	// handed on yet, whose partitions would lose what lies between it and
	// floor otherwise (a take whose floor is inside the batch at hand).
	if from := floor + 1; from < c.scan.next {
		if len(c.pending) > 0 {
			from = min(from, c.pending[0].Seq)
		}
		c.scan, c.pending = scan{next: from}, nil
	}
	c.to = max(c.to, head)
}

// drop takes partition p out of the catch-up.
func (c *catchUp) drop(p int) { delete(c.after, p) }

// nextCaughtUp returns the next event the catch-up hands on, reading a
// batch when none is pending (ok). Otherwise poll says whether it is the
// live read's turn first (Next reads what is at hand, up to turn
// messages, then calls again); neither means no catch-up runs (any that
// ran has ended, its partitions live).
func (r *Reader) nextCaughtUp(ctx context.Context) (ev Event, ok, poll bool, err error) {
	c := &r.catch
	for len(c.after) > 0 {
		for len(c.pending) > 0 {
			ev, c.pending = c.pending[0], c.pending[1:]
			if a, taken := c.after[ev.Partition]; taken && ev.Seq > a {
				c.after[ev.Partition] = ev.Seq
				return ev, true, false, nil
			}
		}
		if c.scan.next > c.to {
			for p := range c.after {
				r.liveFrom[p] = r.head + 1
			}
			c.after = nil
			return Event{}, false, false, nil
		}
		if c.turn > 0 {
			return Event{}, false, true, nil
		}
		if c.pending, err = r.get.read(ctx, &c.scan, c.to); err != nil {
			return Event{}, false, false, err
		}
		c.turn = r.liveTurn()
	}
	return Event{}, false, false, nil
}

// liveTurn is how many live messages the reader reads between two of a
// catch-up's batches: Batch/2, so that the catch-up, which covers up to
// Batch sequences a batch, gains on the head however many of the live
// messages are its partitions'; none when no partition taken is live.
func (r *Reader) liveTurn() int {
	for p, owned := range r.owned {
		if _, catching := r.catch.after[p]; owned && !catching {
			return r.cfg.Batch / 2
		}
	}
	return 0
}
