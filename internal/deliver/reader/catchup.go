package reader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/jsapi"
	"github.com/jsbridge/jsbridge/wire"
)

// catchUp is the read that brings the partitions taken below the
// reader's head up to it: for each such partition p, the events of p in
// (after[p], to], read from next on by batched direct gets of every
// event by sequence (the partition is not in the subject, so the server
// cannot narrow the read to it, and a subject filter, next_by_subj,
// cost about three times as much per event: the design's E7). The
// reader reads nothing live while it runs, so to, its head when the
// catch-up began, stays its head until the catch-up ends, and every
// partition caught up then goes live from to + 1.
type catchUp struct {
	after   map[int]uint64 // partition → last sequence handed on (its floor at first)
	next    uint64         // the next sequence to read
	to      uint64         // the last sequence to read
	pending []Event        // read, not yet handed on
}

// add puts partition p, whose events up to floor are settled, into the
// catch-up up to head.
func (c *catchUp) add(p int, floor, head uint64) {
	if len(c.after) == 0 {
		c.after, c.pending = map[int]uint64{}, nil
		c.next, c.to = floor+1, head
	}
	c.after[p] = floor
	// A partition with a lower floor reads again from there; the others
	// skip what they were already handed (after).
	c.next = min(c.next, floor+1)
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
		if c.next > c.to {
			c.after = nil
			return Event{}, false, nil
		}
		evs, last, err := r.readCatchUp(ctx, c.next, c.to)
		if err != nil {
			return Event{}, false, err
		}
		c.next, c.pending = last+1, evs
	}
	return Event{}, false, nil
}

// readCatchUp reads one batch of the events stream from sequence from,
// keeping the events at or below to of the partitions being caught up;
// last is the last sequence the batch covered (to when it reached past
// it). An answer with nothing at or below to at or after from (a
// follower behind, which may answer a direct get) is read again after a
// pause, ShortReads times at most (ErrBehind).
func (r *Reader) readCatchUp(ctx context.Context, from, to uint64) (evs []Event, last uint64, err error) {
	for short := 1; ; short++ {
		msgs, err := r.directBatch(ctx, from)
		if err != nil {
			return nil, 0, err
		}
		last = from - 1
		for _, m := range msgs {
			ev, err := r.directEvent(m)
			if err != nil {
				return nil, 0, err
			}
			if ev.Seq > to {
				last = to
				break
			}
			last = ev.Seq
			if _, taken := r.catch.after[ev.Partition]; taken && ev.Partition >= 0 {
				evs = append(evs, ev)
			}
		}
		if last >= from {
			return evs, last, nil
		}
		if short >= r.cfg.ShortReads {
			return nil, 0, fmt.Errorf("%w: %s answered nothing from %d to %d, %d times", ErrBehind, r.cfg.Stream, from, to, short)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(time.Duration(short) * 50 * time.Millisecond):
		}
	}
}

// directBatch asks the events stream's direct get for up to Batch
// messages from sequence from, by sequence alone (jetstream_api.go
// JSApiMsgGetRequest, "seq" and "batch"; stream.go getDirectRequest then
// loads each with LoadNextMsg of ">"; any replica with AllowDirect may
// answer) and
// returns the messages of the answer, up to its end (status 204) or a
// not-found (404: nothing at or after from on the replica that answered).
func (r *Reader) directBatch(ctx context.Context, from uint64) ([]*nats.Msg, error) {
	nc := r.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("catch-up of %s: %w", r.cfg.Stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, err := json.Marshal(struct {
		Seq   uint64 `json:"seq"`
		Batch int    `json:"batch"`
	}{from, r.cfg.Batch})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(jsapi.Subject(r.js, "DIRECT.GET."+r.cfg.Stream), inbox, req); err != nil {
		return nil, fmt.Errorf("catch-up of %s: %w", r.cfg.Stream, err)
	}
	var out []*nats.Msg
	for {
		wait, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
		m, err := sub.NextMsgWithContext(wait)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			return out, nil // an answer cut short: what came is read, the rest asked again
		case errors.Is(err, nats.ErrNoResponders):
			return nil, fmt.Errorf("%w: %s", ErrNoDirectGet, r.cfg.Stream)
		case err != nil:
			return nil, fmt.Errorf("catch-up of %s: %w", r.cfg.Stream, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
			out = append(out, m)
		case "204", "404":
			return out, nil
		default:
			return nil, fmt.Errorf("catch-up of %s: direct get answered %s %s", r.cfg.Stream, status, m.Header.Get("Description"))
		}
	}
}

// directEvent is the Event of a direct get's message: the sequence,
// subject and time from the headers the server adds, which are taken off
// so that the headers are the message's own, as the live read hands
// them on. A subject of no event has Partition -1.
func (r *Reader) directEvent(m *nats.Msg) (Event, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Event{}, fmt.Errorf("catch-up of %s: direct get answered a message without a sequence: %w", r.cfg.Stream, err)
	}
	subject := m.Header.Get(jetstream.SubjectHeader)
	stored, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	h := nats.Header{}
	for k, v := range m.Header {
		switch k {
		case jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer,
			jetstream.LastSequenceHeader, wire.HeaderNumPending:
			continue
		}
		h[k] = v
	}
	p, ok := wire.SubjectPartition(r.cfg.Prefix, subject, len(r.owned))
	if !ok {
		p = -1
	}
	return Event{Seq: seq, Subject: subject, Partition: p, Header: h, Data: m.Data, Time: stored}, nil
}
