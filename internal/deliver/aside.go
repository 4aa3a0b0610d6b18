package deliver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/owner"
	"github.com/jsbridge/jsbridge/wire"
)

// A stream set aside (docs/ordering.md, "A stuck stream is set aside").
// A stream whose head the receiver refuses (a 5xx retried in place, an
// order gate's gap) cannot send its later events; kept in hand, they
// filled the replica's hand limit (every partition of the subscription
// stopped pulling), and kept pending, the partition consumer's
// MaxAckPending (a Nak, even with a delay, keeps a message pending until
// it is acked: its partition stopped). Nak'ing them back was tried and
// withdrawn: a Nak'd event is pending and out of hand, so the fence
// waited for it, the ack floor stayed below it, and the successor check
// took it for an event a former owner acked.
//
// So once a refused head has asideAfter events of its stream queued
// behind it, the stream is set aside: the run loop takes those events out
// of hand, writes a record in the park bucket (wire.AsideKey) naming the
// head and the copy sequence of the first event taken (Start, and From:
// where the stream is read again from), then acks them out of the
// partition consumer undelivered (double acks, tracked), and every later
// event of the stream at or after Start as it comes. The head goes on in
// its lane. Once it settled and nothing of the stream before Start is in
// hand (a parked stream waits for its unpark), the partition reads the
// stream's events from the partitioned copy in order (direct gets by
// subject, from From on) and delivers each through the same head of
// line, moving From past it before it counts as settled. When the copy
// has nothing more, no event at or after From was acked out meanwhile and
// nothing before From can still come from the partition consumer (every
// ack-out confirmed and every event read again acked out, or the ack
// floor past it), the record is deleted and the stream is live again: its
// next event comes from the partition consumer, after the successor
// check. A new owner reads its partition's records before its fence
// passes and re-reads from From. An event is acked out only once the
// record names it or an earlier one, and From passes an event only once
// it was delivered or dead-lettered.

// asideAfter is how many events of a stream queued behind its refused
// head may set the stream aside: once the head has been refused for
// asideWait, or at once when the subscription's hand limit is full or
// half the partition consumer's MaxAckPending is in hand. A head refused
// once and accepted at its next attempt costs nothing more.
const asideAfter = 4

// asideWait is how long a head is refused before its stream may be set
// aside without the limits pressing.
const asideWait = time.Second

// asideRecord is the park bucket record of a stream set aside
// (wire.AsideKey), spelled once in wire: `consumer status` and the
// migration read it too.
type asideRecord = wire.AsideRecord

// asideStream is a stream set aside on this partition.
type asideStream struct {
	rec asideRecord
	rev uint64 // the record's revision
	// maxOut is the highest sequence of the stream acked out.
	maxOut uint64
	// out holds the sequences of the stream acked out here, true once
	// JetStream confirmed the ack (a double ack): an ack-out lost or not
	// sent leaves its event pending, to come back later, and the stream
	// must not be live again then.
	out map[uint64]bool
	// read holds the sequences read again from the copy and settled here.
	read []uint64
	// whole is true when the stream was set aside here: every event of it
	// from Start on was acked out here or is still to come (a stream
	// loaded from a former owner's record is not: it may have read events
	// again before the partition consumer delivered them).
	whole bool
	// last is the stream's last event settled here since it was set
	// aside (seq 0: none).
	last streamPos
	// stuck is true while the stream is counted in stuckGauge.
	stuck bool
	// reading is true while a re-read runs; caughtUp, once it ended with
	// nothing more in the copy from sequence caughtUpAt on.
	reading    bool
	caughtUp   bool
	caughtUpAt uint64
}

// asides is a partition's streams set aside, and the heads refused in
// place that may set theirs aside. The run loop sets streams aside, acks
// out their events and turns them live again; the lanes report refused
// heads and settle events (settle).
type asides struct {
	kv         jetstream.KeyValue // the park bucket
	sub        string
	p          int
	replicaID  string
	clock      clockwork.Clock
	log        *slog.Logger
	copyStream func(context.Context) (jetstream.Stream, error)
	filters    []string // the partition consumer's filter subjects
	// gauge counts the streams aside on this replica (the subscription's
	// jsbridge_consumer_streams_set_aside); nil: not counted.
	gauge prometheus.Gauge
	// stuckGauge counts the streams aside here for stuckAfter or longer,
	// their head refused in place (not parked): the subscription's
	// jsbridge_consumer_streams_set_aside_stuck; nil: not counted.
	stuckGauge prometheus.Gauge
	stuckAfter time.Duration // Config.OrderStuckAfter (0: never stuck)
	stuckAt    time.Time     // when tendStuck last counted

	any     atomic.Bool // a head is refused or a stream is aside
	mu      sync.Mutex
	refused map[string]refusedHead // stream key → its head retried in place
	streams map[string]*asideStream
	// reread is, for a stream that was read again and is live again, the
	// sequences each re-read covered: a copy of one of them that arrives
	// late (one already on its way when its ack-out was confirmed) is
	// acked, not delivered again.
	reread map[string][][2]uint64
}

func newAsides(kv jetstream.KeyValue, sub string, p int, replicaID string, clock clockwork.Clock, log *slog.Logger,
	copyStream func(context.Context) (jetstream.Stream, error), filters []string) *asides {
	return &asides{
		kv: kv, sub: sub, p: p, replicaID: replicaID, clock: clock, log: log, copyStream: copyStream, filters: filters,
		refused: map[string]refusedHead{}, streams: map[string]*asideStream{}, reread: map[string][][2]uint64{},
	}
}

// refusedHead is a head of line retried in place: a subject of its
// stream, its sequence, since when, its event id and version, and the
// receiver's last answer (settlement reason). parked: not a refused
// head, but a parked stream's held events (setAsideParked).
type refusedHead struct {
	subject          string
	seq              uint64
	since            time.Time
	eventID, version string
	answer           string
	parked           bool
}

// refusedHead records that m, of stream key, is being retried in place (a
// head of line refused), answer the receiver's last answer. Nil-safe.
func (as *asides) refusedHead(key string, m jetstream.Msg, answer string) {
	if as == nil || isReread(m) {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.streams[key] != nil {
		return
	}
	h, ok := as.refused[key]
	if !ok {
		h = refusedHead{subject: m.Subject(), seq: streamSeq(m), since: as.clock.Now(), eventID: attempt.EventID(m), version: m.Headers().Get(wire.HeaderStreamVersion)}
		as.any.Store(true)
	}
	h.answer = answer
	as.refused[key] = h
}

// headEnded records that m, of stream key, left its lane (settled,
// held, or returned). Nil-safe.
func (as *asides) headEnded(key string, m jetstream.Msg) {
	if as == nil || isReread(m) {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	delete(as.refused, key)
	as.recount()
}

// counted moves the gauge by n streams.
func (as *asides) counted(n int) {
	if as.gauge != nil {
		as.gauge.Add(float64(n))
	}
}

// released uncounts the streams aside: the partition was released (their
// records stay for the next owner). Nil-safe.
func (as *asides) released() {
	if as == nil {
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	as.counted(-len(as.streams))
	for _, a := range as.streams {
		as.countStuck(a, false)
	}
	clear(as.streams)
}

// countStuck sets whether a is counted in stuckGauge. as.mu is held.
func (as *asides) countStuck(a *asideStream, stuck bool) {
	if a.stuck == stuck {
		return
	}
	a.stuck = stuck
	if as.stuckGauge != nil {
		if stuck {
			as.stuckGauge.Inc()
		} else {
			as.stuckGauge.Dec()
		}
	}
}

// tendStuck counts, at most once a second, the streams aside for
// stuckAfter or longer (since their record's At) whose head is refused
// in place, not parked (parked reports whether the stream of a subject
// in the copy is): the order-stuck bound parks a head refused by the
// order gate, and max_deliver one that fails, but with max_deliver -1,
// or a head whose refusals are not continuous, the stream may stay
// aside for ever. Only the run loop calls it.
func (as *asides) tendStuck(parked func(subject string) bool) {
	now := as.clock.Now()
	if as.stuckAfter <= 0 || now.Sub(as.stuckAt) < time.Second {
		return
	}
	as.stuckAt = now
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, a := range as.streams {
		as.countStuck(a, !a.rec.Parked && now.Sub(a.rec.At) >= as.stuckAfter && !parked(a.rec.Subject))
	}
}

// recount sets any. as.mu is held.
func (as *asides) recount() {
	as.any.Store(len(as.streams) > 0 || len(as.refused) > 0 || len(as.reread) > 0)
}

// candidates returns the streams whose refused head may set them aside
// (refused for asideWait, or any when the limits press), with their
// heads.
func (as *asides) candidates(pressed bool) map[string]refusedHead {
	as.mu.Lock()
	defer as.mu.Unlock()
	var out map[string]refusedHead
	now := as.clock.Now()
	for k, h := range as.refused {
		if as.streams[k] == nil && (pressed || now.Sub(h.since) >= asideWait) {
			if out == nil {
				out = map[string]refusedHead{}
			}
			out[k] = h
		}
	}
	return out
}

// isAside reports whether stream key is set aside on this partition.
func (as *asides) isAside(key string) bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.streams[key] != nil
}

// record writes the record that sets stream key (head.subject: one of its
// subjects in the copy) aside from sequence from on, and adds the stream.
func (as *asides) record(ctx context.Context, key string, head refusedHead, from uint64) error {
	rec := asideRecord{Subscription: as.sub, Partition: as.p, Subject: head.subject, Head: head.seq, Start: from, From: from, Replica: as.replicaID, At: as.clock.Now().UTC(),
		HeadEventID: head.eventID, HeadVersion: head.version, Answer: head.answer, Parked: head.parked}
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rev, err := as.kv.Put(ctx, wire.AsideKey(as.sub, as.p, key), v)
	if err != nil {
		// The put may have landed although its answer did not: a record
		// nobody knows of would make a later owner read again events
		// delivered live meanwhile. Delete it (the same connection: the
		// server takes the delete after the put).
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer dcancel()
		if derr := as.kv.Delete(dctx, wire.AsideKey(as.sub, as.p, key)); derr != nil {
			as.log.Error("a record of a stream set aside may be left behind; if it is, a later owner sends the stream's events from its start again (at least once): delete it",
				slog.String("key", wire.AsideKey(as.sub, as.p, key)), slog.Any("error", derr))
		}
		return fmt.Errorf("record stream set aside: %w", err)
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	as.streams[key] = &asideStream{rec: rec, rev: rev, out: map[uint64]bool{}, whole: true}
	as.counted(1)
	delete(as.refused, key)
	as.recount()
	return nil
}

// load reads the subscription's records of this partition from the park
// bucket and adds the streams not known here yet (a former owner set them
// aside). The fence calls it before it passes.
func (as *asides) load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := as.kv.ListKeysFiltered(ctx, wire.AsideFilterPartition(as.sub, as.p))
	if err != nil {
		return fmt.Errorf("list streams set aside of subscription %q: %w", as.sub, err)
	}
	defer func() { _ = keys.Stop() }()
	for k := range keys.Keys() {
		e, err := as.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read stream set aside %q: %w", k, err)
		}
		var rec asideRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			as.log.Warn("unreadable record of a stream set aside; ignored", slog.String("key", k), slog.Any("error", err))
			continue
		}
		if rec.Partition != as.p || rec.Subject == "" {
			continue
		}
		key := wire.StreamKey(rec.Subject)
		as.mu.Lock()
		if as.streams[key] == nil {
			as.log.Info("a stream was set aside by a former owner; its events are read again from the copy", slog.String("stream_key", key), slog.Uint64("from", rec.From))
			as.streams[key] = &asideStream{rec: rec, rev: e.Revision(), out: map[uint64]bool{}}
			as.counted(1)
			as.recount()
		}
		as.mu.Unlock()
	}
	return ctx.Err()
}

// takes reports whether msg, of stream key, arriving from the partition
// consumer, is taken care of here: acked out (its stream is aside from
// msg's sequence or earlier: the re-read delivers it), or acked as a late
// copy of an event a re-read delivered. mayAck is the lease fence's.
func (as *asides) takes(key string, msg jetstream.Msg, mayAck func() error) bool {
	if as == nil || !as.any.Load() {
		return false
	}
	seq := streamSeq(msg)
	as.mu.Lock()
	a := as.streams[key]
	if a == nil || seq < a.rec.Start {
		late := false
		for _, r := range as.reread[key] {
			late = late || (seq >= r[0] && seq <= r[1])
		}
		as.mu.Unlock()
		if !late {
			return false
		}
		if mayAck() == nil {
			_ = msg.Ack() // a late copy of an event acked out and read again
		}
		return true
	}
	as.mu.Unlock()
	as.ackOut(key, []jetstream.Msg{msg}, mayAck)
	return true
}

// ackOut acks msgs, events of stream key at or after its record's Start,
// out of the partition consumer, each with a double ack on its own
// goroutine (the run loop does not wait): the stream goes live again only
// once every ack-out was confirmed. One not sent (past the lease
// deadline) leaves its event pending: it comes back and is acked out then.
func (as *asides) ackOut(key string, msgs []jetstream.Msg, mayAck func() error) {
	as.mu.Lock()
	a := as.streams[key]
	if a == nil {
		as.mu.Unlock()
		return
	}
	var send []jetstream.Msg
	for _, m := range msgs {
		seq := streamSeq(m)
		a.maxOut = max(a.maxOut, seq)
		if done := a.out[seq]; !done {
			a.out[seq] = false
			send = append(send, m)
		}
	}
	as.mu.Unlock()
	if mayAck() != nil {
		return
	}
	for _, m := range send {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := m.DoubleAck(ctx)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				return // pending still: it comes back and is acked out again
			}
			as.mu.Lock()
			if a := as.streams[key]; a != nil {
				a.out[streamSeq(m)] = true
			}
			as.mu.Unlock()
		}()
	}
}

// settle moves the record of m's stream past m, which was delivered or
// dead-lettered, before m is acked: once acked (or, read from the copy,
// counted as settled) m is never sent again. Nothing when m's stream is
// not aside or m comes before its record's sequence. Nil-safe.
func (as *asides) settle(ctx context.Context, m jetstream.Msg) error {
	if as == nil || !as.any.Load() {
		return nil
	}
	key, seq := wire.StreamKey(m.Subject()), streamSeq(m)
	as.mu.Lock()
	a := as.streams[key]
	if a == nil || seq < a.rec.From {
		as.mu.Unlock()
		return nil
	}
	rec, rev := a.rec, a.rev
	as.mu.Unlock()
	rec.From, rec.Replica = seq+1, as.replicaID
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rev, err = as.kv.Update(ctx, wire.AsideKey(as.sub, as.p, key), v, rev)
	if owner.RevisionLost(err) {
		// An earlier try landed although its answer was lost (a KV
		// leader moving): the record says just what this write does.
		// Without this, every retry failed the same way and the
		// partition was released after 10 tries.
		if e, gerr := as.kv.Get(ctx, wire.AsideKey(as.sub, as.p, key)); gerr == nil && bytes.Equal(e.Value(), v) {
			rev, err = e.Revision(), nil
		}
	}
	if err != nil {
		return fmt.Errorf("move the record of a stream set aside past sequence %d: %w", seq, err)
	}
	as.mu.Lock()
	a.rec, a.rev, a.last = rec, rev, positionOf(m)
	if isReread(m) {
		a.read = append(a.read, seq)
	}
	as.mu.Unlock()
	return nil
}
