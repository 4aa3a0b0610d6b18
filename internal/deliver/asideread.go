package deliver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/wire"
)

// toRead returns the streams set aside whose re-read may start now (no
// re-read running, and ready says so: see partition.mayReread) with their
// record's sequence, marking them reading.
func (as *asides) toRead(ready func(key string, rec asideRecord, whole bool) bool) map[string]uint64 {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out map[string]uint64
	for k, a := range as.streams {
		if a.reading || a.caughtUp || !ready(k, a.rec, a.whole) {
			continue
		}
		if out == nil {
			out = map[string]uint64{}
		}
		a.reading = true
		out[k] = a.rec.From
	}
	return out
}

// readEnded records the end of stream key's re-read: caught up (nothing
// more of the stream in the copy from sequence at on), or stopped.
func (as *asides) readEnded(key string, caughtUp bool, at uint64) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if a := as.streams[key]; a != nil {
		a.reading, a.caughtUp, a.caughtUpAt = false, caughtUp, at
	}
}

// caughtUp returns the streams whose re-read caught up, each with the
// sequence it reached, and whether they are known to be settled here (see
// settledHere). Those of which an event at or after that sequence was
// acked out meanwhile are read again instead (not returned).
func (as *asides) caughtUp() map[string]caughtUpStream {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out map[string]caughtUpStream
	for k, a := range as.streams {
		if !a.caughtUp {
			continue
		}
		if a.maxOut >= a.caughtUpAt {
			a.caughtUp = false // an event came live meanwhile: read on
			continue
		}
		if out == nil {
			out = map[string]caughtUpStream{}
		}
		out[k] = caughtUpStream{at: a.caughtUpAt, settled: a.settledHere(), outDone: a.outDone()}
	}
	return out
}

// caughtUpStream is a stream whose re-read found nothing more from at on;
// settled and outDone as asideStream.settledHere and outDone say.
type caughtUpStream struct {
	at      uint64
	settled bool
	outDone bool
}

// outDone reports whether every ack-out of the stream was confirmed.
func (a *asideStream) outDone() bool {
	for _, done := range a.out {
		if !done {
			return false
		}
	}
	return true
}

// settledHere reports whether no event of the stream the re-read
// delivered can still come from the partition consumer: the stream was
// set aside here, every ack-out was confirmed, and every event read again
// was acked out too (the re-read may read an event from the copy before
// the partition consumer delivers it). Else only the consumer's ack floor
// can say (partition.goLive).
func (a *asideStream) settledHere() bool {
	if !a.whole || !a.outDone() {
		return false
	}
	for _, seq := range a.read {
		if !a.out[seq] {
			return false
		}
	}
	return true
}

// readOn makes stream key's re-read start again (it waits for the floor).
func (as *asides) readOn(key string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if a := as.streams[key]; a != nil {
		a.caughtUp = false
	}
}

// goLive deletes stream key's record and forgets it: the stream is live
// again, the re-read having covered it up to sequence upTo. It returns
// the stream's last event settled since it was set aside when known
// (seq 0: not).
func (as *asides) goLive(ctx context.Context, key string, upTo uint64) (streamPos, error) {
	as.mu.Lock()
	a := as.streams[key]
	if a == nil {
		as.mu.Unlock()
		return streamPos{}, nil
	}
	rev := a.rev
	as.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := as.kv.Delete(ctx, wire.AsideKey(as.sub, as.p, key), jetstream.LastRevision(rev)); err != nil {
		return streamPos{}, fmt.Errorf("delete the record of a stream set aside: %w", err)
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	delete(as.streams, key)
	as.counted(-1)
	as.countStuck(a, false)
	if upTo >= a.rec.Start {
		as.reread[key] = append(as.reread[key], [2]uint64{a.rec.Start, upTo})
	}
	as.recount()
	return a.last, nil
}

// next returns the first event of stream key in the copy at or after
// sequence from that one of the partition consumer's filters matches
// (nil: none).
func (as *asides) next(ctx context.Context, key string, from uint64) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := as.copyStream(ctx)
	if err != nil {
		return nil, err
	}
	var first *jetstream.RawStreamMsg
	for _, f := range as.filters {
		subj, ok := wire.IntersectFilters(f, key+".*")
		if !ok {
			continue
		}
		m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if first == nil || m.Sequence < first.Sequence {
			first = m
		}
	}
	return first, nil
}
