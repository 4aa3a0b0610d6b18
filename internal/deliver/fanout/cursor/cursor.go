// Package cursor is how a subscription of the shared engine that is not
// live reads its events: Read (one read's bounds: a subscription's
// filters on one partition, between two sequences) and Reader, which
// answers it from the events stream through reader.Cursor's batched
// direct gets, keeping each cursor between reads. The fan-out
// (internal/deliver/fanout) asks for the reads, through an interface of
// its own that Reader implements.
package cursor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// Read is one read of a cursor: the events of Partition matching
// any of Filters in (After, To], at most Max.
type Read struct {
	// Subscription is the subscription's name, Filters its filters.
	Subscription string
	Filters      []string
	// Stream is set for a stream cursor (a stream set aside, its
	// wire.StreamKey): Filters are then the subscription's narrowed to
	// the stream.
	Stream string
	// Partition is the partition whose events are kept (the others of
	// the filters are dropped by the reader, as the live read does).
	Partition int
	// After and To bound the sequences read: (After, To], To being the
	// live head when the read began.
	After, To uint64
	// Max bounds the events answered (what the subscription may still
	// hold), 1 or more.
	Max int
}

// Reader reads cursors (Read) from the events stream: a reader.Cursor
// (batched direct gets filtered by subject) per subscription and
// partition, kept between reads so that a catch-up reads each event of
// its filters once, and each answer keeping the events of the read's
// partition. Safe for concurrent use. Make one with NewReader.
type Reader struct {
	js   jetstream.JetStream
	cfg  reader.Config
	mu   sync.Mutex
	open map[string]*openCursor // by subscription and partition
}

type openCursor struct {
	c       *reader.Cursor
	filters []string
	at      uint64 // the read is complete up to here
}

// NewReader reads the events stream cfg names (its defaults as for
// reader.Open: EVENTS, "events", 16 partitions) on js; cfg.Partitions
// must be the replica's P.
func NewReader(js jetstream.JetStream, cfg reader.Config) *Reader {
	return &Reader{js: js, cfg: cfg, open: map[string]*openCursor{}}
}

// Read returns the events of r in stream order, at most r.Max, and
// through, the sequence up to which the answer is complete (r.To once
// the read reached it). A read that goes on from where the last
// one of the subscription and partition ended reuses its cursor; any
// other makes a new one from r.After + 1. Errors are reader.NewCursor's
// (ErrInvalidConfig) and reader.Cursor.Next's (ErrBehind,
// ErrNoDirectGet, ctx's); after one the next read starts afresh.
func (cs *Reader) Read(ctx context.Context, r Read) ([]reader.Event, uint64, error) {
	if r.Max < 1 || r.To <= r.After {
		return nil, r.After, nil
	}
	key := r.Subscription + "." + strconv.Itoa(r.Partition) + "." + r.Stream
	cs.mu.Lock()
	oc := cs.open[key]
	delete(cs.open, key) // one read at a time of a cursor: back below
	cs.mu.Unlock()
	if oc == nil || oc.at != r.After || !slices.Equal(oc.filters, r.Filters) {
		c, err := reader.NewCursor(cs.js, cs.cfg, r.Filters, r.After+1, r.To)
		if err != nil {
			return nil, r.After, fmt.Errorf("cursor: cursor of %s: %w", r.Subscription, err)
		}
		oc = &openCursor{c: c, filters: slices.Clone(r.Filters)}
	}
	oc.c.Extend(r.To)
	var out []reader.Event
	for len(out) < r.Max {
		ev, err := oc.c.Next(ctx)
		if errors.Is(err, reader.ErrCaughtUp) {
			oc.at = r.To
			break
		}
		if err != nil {
			return nil, r.After, fmt.Errorf("cursor: cursor of %s: %w", r.Subscription, err)
		}
		if ev.Partition == r.Partition {
			out = append(out, ev)
			oc.at = ev.Seq
		}
	}
	cs.mu.Lock()
	cs.open[key] = oc
	cs.mu.Unlock()
	return out, oc.at, nil
}

// Drop forgets subscription sub's cursors on partition p, its stream
// cursors with it (it rejoined, or the partition went).
func (cs *Reader) Drop(sub string, p int) {
	prefix := sub + "." + strconv.Itoa(p) + "."
	cs.mu.Lock()
	for k := range cs.open {
		if strings.HasPrefix(k, prefix) {
			delete(cs.open, k)
		}
	}
	cs.mu.Unlock()
}
