package shared

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/reader"
)

// What a replay by time reads under the shared engine
// (docs/design/next-engine.md section 3, "consumer replay --since"): a
// cursor with an end, run by the command and not by the owners, from the
// first sequence stored at the window's start to the events stream's
// last at the call, by direct gets; the chain before the window as a new
// owner looks it up. None of it needs Start.

// SeqBefore returns the events stream's last sequence stored before t
// (its last sequence for a zero t), found by binary search on the
// stored times, each message read from the stream's leader. Errors: the
// stream's.
func (r *Replica) SeqBefore(ctx context.Context, t time.Time) (uint64, error) {
	return r.seqs.Before(ctx, t)
}

// WindowCursor returns a cursor (reader.NewCursor) of the replica's
// events stream over filters, from sequence from to to: the events of
// a replay by time, in the stream's order.
func (r *Replica) WindowCursor(filters []string, from, to uint64) (*reader.Cursor, error) {
	return reader.NewCursor(r.js, r.rcfg, filters, from, to)
}

// Predecessor returns the version subscription sub delivered of the
// source stream with events stream key stream before the event at
// sequence before (fanout.NoPrevious: none), as the replica's chain
// looks it up for a stream's first event since a claim: the stream's
// last event before it that the subscription's filters select, stepped
// over the versions the positions bucket skipped holds as dead-lettered
// and not delivered (nil: none read). A subscription the replica does
// not have: NoPrevious. Errors: the look-up's.
func (r *Replica) Predecessor(ctx context.Context, skipped jetstream.KeyValue, sub, stream string, before uint64) (int64, error) {
	c := chain{js: r.js, stream: r.cfg.Stream, members: r.members, skipped: skipped}
	return c.Previous(ctx, sub, stream, before)
}
