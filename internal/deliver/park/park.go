// Package park is the consumer engine's room for parked streams
// (DeadLetterPark): an ordered subscription's park entries in the park
// bucket (wire.DefaultParkBucket), the events a replica holds behind
// them for the partitions that pulled them, unparking and the re-read of
// a new owner, the keep-alive of held events, and the sweep of the
// bucket's delete markers. It imports nothing of the engine above it: a
// partition is a Holder (its number and how it acks, InProgresses and
// Naks through its lease fence), and the rest comes in Config and Deps.
package park

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/deliver/ordercopy"
	"github.com/jsbridge/jsbridge/wire"
)

// A parked stream (DeadLetterPark): its dead-lettered head is in the DLQ,
// an entry in the park bucket names it, and its later events stay pending
// on the partition consumer, held in memory by the partition's owner
// (InProgress every AckWait/2) and never delivered, until the entry is
// deleted by Replay (after the head was delivered) or SkipParked. They are
// never acked while parked, so nothing is lost across restarts and
// hand-overs: a new owner gets them again and holds them again. The price:
// each held event occupies one of the partition consumer's MaxAckPending
// slots, so once they press on it the partition sets the stream aside
// (setAsideParked): its held events are acked out behind an aside record
// and read again from the copy once it is unparked (docs/ordering.md,
// "Dead letters").

// Config is one ordered subscription's parking.
type Config struct {
	// Subscription is the subscription's name: its park entries' keys
	// (wire.ParkedKey) and the metrics' label.
	Subscription string
	// AckWait is the subscription's AckWait: held events get InProgress
	// every min(AckWait/2, 5 s).
	AckWait time.Duration
	// ReplicaID is this replica's id, recorded in the entries it writes.
	ReplicaID string
	// CopyStream is the partitioned copy's name (wire.OrderedStream), named
	// in the cause of a held event at risk of leaving it.
	CopyStream string
}

// Metrics are the engine's gauges parking sets, each by subscription;
// a nil one is not set.
type Metrics struct {
	// Parked is jsbridge_consumer_streams_parked.
	Parked *prometheus.GaugeVec
	// OrderStuck is jsbridge_consumer_streams_order_stuck.
	OrderStuck *prometheus.GaugeVec
	// OldestHeld is jsbridge_consumer_oldest_held_seconds.
	OldestHeld *prometheus.GaugeVec
}

// Deps are what parking takes from the engine.
type Deps struct {
	// Clock is the engine's clock: entries' times, held events' ages,
	// the keep-alive's ticks, the watch's pause (nil: the wall clock).
	Clock clockwork.Clock
	// Logger logs parks, unparks and failures (nil: discarded).
	Logger *slog.Logger
	// Metrics are the gauges KeepAlive sets.
	Metrics Metrics
	// CopyMaxAge is the partitioned copy's MaxAge as last read (0: none;
	// nil: never at risk).
	CopyMaxAge func() time.Duration
	// WatchFailed is called when watching the park bucket failed with
	// err, before the watch is tried again: the engine creates its
	// buckets again when err says they are gone (nil: nothing).
	WatchFailed func(ctx context.Context, err error)
}

// Parking is an ordered subscription's parked streams on this replica:
// the park entries it wrote or watched, the events it holds behind them,
// and the park bucket's side of both. Its methods are safe for
// concurrent use.
type Parking struct {
	sub        string
	ackWait    time.Duration
	replicaID  string
	copyStream string
	log        *slog.Logger
	metrics    Metrics
	clock      clockwork.Clock
	copyMaxAge func() time.Duration
	failed     func(context.Context, error)

	// bucket is the park bucket and the events prefix, once provisioned.
	bucket atomic.Pointer[bucket]

	mu     sync.Mutex
	parked map[string]*parkedStream // by park bucket key
}

// bucket is where the park entries live: the park bucket, and the
// events stream's subject prefix their keys are made from.
type bucket struct {
	kv           jetstream.KeyValue
	eventsPrefix string
}

// New returns the parking of cfg.Subscription. It needs the park bucket
// (Provisioned) before it parks, re-reads or keeps events alive.
func New(cfg Config, deps Deps) *Parking {
	pk := &Parking{sub: cfg.Subscription, ackWait: cfg.AckWait, replicaID: cfg.ReplicaID, copyStream: cfg.CopyStream,
		log: deps.Logger, metrics: deps.Metrics, clock: deps.Clock, copyMaxAge: deps.CopyMaxAge, failed: deps.WatchFailed,
		parked: map[string]*parkedStream{}}
	if pk.log == nil {
		pk.log = slog.New(slog.DiscardHandler)
	}
	if pk.clock == nil {
		pk.clock = clockwork.NewRealClock()
	}
	if pk.copyMaxAge == nil {
		pk.copyMaxAge = func() time.Duration { return 0 }
	}
	if pk.failed == nil {
		pk.failed = func(context.Context, error) {}
	}
	return pk
}

// Provisioned hands parking the park bucket kv and the events stream's
// subject prefix (ordercopy.EventsPrefix), once the engine provisioned
// them.
func (pk *Parking) Provisioned(kv jetstream.KeyValue, eventsPrefix string) {
	pk.bucket.Store(&bucket{kv: kv, eventsPrefix: eventsPrefix})
}

// kv is the park bucket (nil before Provisioned).
func (pk *Parking) kv() jetstream.KeyValue {
	if b := pk.bucket.Load(); b != nil {
		return b.kv
	}
	return nil
}

// eventsPrefix is the events stream's subject prefix (before
// Provisioned: wire.DefaultEventsPrefix).
func (pk *Parking) eventsPrefix() string {
	if b := pk.bucket.Load(); b != nil {
		return b.eventsPrefix
	}
	return wire.DefaultEventsPrefix
}

// parkedStream is a parked stream on this replica: its entry and the
// events this replica holds behind it.
type parkedStream struct {
	entry     deadletter.ParkedStream
	held      []heldMsg // in stream order
	releasing bool      // its entry was deleted: see unpark
}

// heldMsg is an event held behind a parked head.
type heldMsg struct {
	h   *Holder // the partition holding it
	msg jetstream.Msg
	at  time.Time // when it was held, on the engine's clock
}

// Holder is a partition as its parked streams' events see it: its number,
// and how it acks, InProgresses and Naks them (through its lease fence).
// Held events are told apart by their Holder's pointer, so a partition
// makes one and passes the same pointer to every call.
type Holder struct {
	// P is the partition's number, recorded in the park entries it writes.
	P int
	// Ack acks a redelivered head (dead-lettered already, its ack lost).
	Ack func(jetstream.Msg)
	// InProgress keeps a held event pending (not past the partition's
	// lease, nor while disconnected).
	InProgress func(jetstream.Msg) error
	// Nak gives a held event back to JetStream (ReturnHeld).
	Nak func(jetstream.Msg)
}

// park records m's stream as parked behind m (already dead-lettered). An
// entry that exists already (m redelivered after a crash) is kept.
func (pk *Parking) Park(h *Holder, m jetstream.Msg, dl deadletter.Letter) error {
	kv, prefix := pk.kv(), pk.eventsPrefix()
	if kv == nil {
		return errNotProvisioned
	}
	subject := wire.EventsSubject(prefix, m.Subject())
	key := wire.StreamKey(subject)
	stream, _, _ := wire.ParseSubject(prefix, subject)
	e := deadletter.ParkedStream{
		Subscription: pk.sub, Stream: stream, Subject: subject, HeadEventID: dl.EventID, HeadVersion: m.Headers().Get(wire.HeaderStreamVersion),
		Partition: h.P, ParkedAt: pk.clock.Now().UTC(), Replica: pk.replicaID, Reason: dl.Reason, OrderStuck: dl.OrderStuck,
	}
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	bk := wire.ParkedKey(pk.sub, key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := kv.Create(ctx, bk, v); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("park stream %q of subscription %q: %w", stream, pk.sub, err)
	}
	pk.mu.Lock()
	if cur := pk.parked[bk]; cur == nil {
		pk.parked[bk] = &parkedStream{entry: e}
	} else if cur.releasing {
		cur.entry, cur.releasing = e, false
	}
	pk.mu.Unlock()
	return nil
}

// parkedKey is the park bucket key of the stream of a message of the
// partitioned copy.
func (pk *Parking) parkedKey(subject string) string {
	return wire.ParkedKey(pk.sub, wire.StreamKey(wire.EventsSubject(pk.eventsPrefix(), subject)))
}

// isParked reports whether the stream of subject (in the partitioned
// copy) is parked, its entry not deleted.
func (pk *Parking) IsParked(subject string) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if len(pk.parked) == 0 {
		return false
	}
	ps := pk.parked[pk.parkedKey(subject)]
	return ps != nil && !ps.releasing
}

// hold keeps m (of stream key) when its stream is parked and reports
// whether it did. A redelivered head (dead-lettered, but its ack lost) is
// acked instead.
func (pk *Parking) Hold(h *Holder, key string, m jetstream.Msg) bool {
	pk.mu.Lock()
	if len(pk.parked) == 0 {
		pk.mu.Unlock()
		return false
	}
	ps := pk.parked[pk.parkedKey(m.Subject())]
	if ps == nil {
		pk.mu.Unlock()
		return false
	}
	if attempt.EventID(m) == ps.entry.HeadEventID {
		pk.mu.Unlock()
		h.Ack(m)
		return true
	}
	seq := streamSeq(m)
	i, found := slices.BinarySearchFunc(ps.held, seq, func(x heldMsg, s uint64) int {
		return cmp.Compare(streamSeq(x.msg), s)
	})
	if found {
		ps.held[i].msg = m
	} else {
		ps.held = slices.Insert(ps.held, i, heldMsg{h: h, msg: m, at: pk.clock.Now()})
	}
	pk.mu.Unlock()
	return true
}

// returnHeld Naks the events held for h's streams (h is being released:
// the next owner holds them again).
func (pk *Parking) ReturnHeld(h *Holder) {
	pk.mu.Lock()
	var back []jetstream.Msg
	for _, ps := range pk.parked {
		keep := ps.held[:0]
		for _, x := range ps.held {
			if x.h == h {
				back = append(back, x.msg)
			} else {
				keep = append(keep, x)
			}
		}
		ps.held = keep
	}
	pk.mu.Unlock()
	for _, m := range back {
		h.Nak(m)
	}
}

// heldBy returns the parked streams (not releasing) with events held for
// h, each as a subject of it in the partitioned copy by its stream key
// there, and how many events are held for h in all.
func (pk *Parking) HeldBy(h *Holder) (map[string]string, int) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	var out map[string]string
	total := 0
	for _, ps := range pk.parked {
		if ps.releasing {
			continue
		}
		for _, x := range ps.held {
			if x.h != h {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[wire.StreamKey(x.msg.Subject())] = x.msg.Subject()
			total++
		}
	}
	return out, total
}

// takeHeld removes the events of subject's stream (a subject in the
// partitioned copy) held for h and returns them, in stream order: the
// partition sets the stream aside (asidepartition.go, setAsideParked).
func (pk *Parking) TakeHeld(h *Holder, subject string) []jetstream.Msg {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	ps := pk.parked[pk.parkedKey(subject)]
	if ps == nil {
		return nil
	}
	var out []jetstream.Msg
	keep := ps.held[:0]
	for _, x := range ps.held {
		if x.h == h {
			out = append(out, x.msg)
		} else {
			keep = append(keep, x)
		}
	}
	ps.held = keep
	return out
}

// addHeld adds to seqs the stream sequences of the events held for h.
func (pk *Parking) AddHeld(h *Holder, seqs map[uint64]bool) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	for _, ps := range pk.parked {
		for _, x := range ps.held {
			if x.h == h {
				seqs[streamSeq(x.msg)] = true
			}
		}
	}
}

// unpark marks a stream whose park entry was deleted as releasing: it
// stays in the map, so events of it still arriving are held, until the run
// loop of its partition hands the held events to the lanes, in stream order
// (releaseFor), before any newer event it pulls.
func (pk *Parking) unpark(bk string) {
	pk.mu.Lock()
	ps := pk.parked[bk]
	var stream string
	var held int
	if ps != nil {
		ps.releasing = true
		stream, held = ps.entry.Stream, len(ps.held) // read under the lock: Hold appends to held
	}
	pk.mu.Unlock()
	if ps != nil {
		pk.log.Info("stream unparked; its held events go on", slog.String("stream", stream), slog.Int("held", held))
	}
}

// releaseFor removes the releasing streams whose held events are all h's
// (or none) and returns those events, in stream order, for h's run loop to
// dispatch.
func (pk *Parking) ReleaseFor(h *Holder) []jetstream.Msg {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	var out []jetstream.Msg
	for bk, ps := range pk.parked {
		if !ps.releasing {
			continue
		}
		mine := true
		for _, x := range ps.held {
			if x.h != h {
				mine = false
				break
			}
		}
		if !mine {
			continue
		}
		for _, x := range ps.held {
			out = append(out, x.msg)
		}
		delete(pk.parked, bk)
	}
	return out
}

// reread reads the subscription's park entries from the park bucket
// itself (not the watch, which may be re-subscribing and not have sent an
// entry written meanwhile) and parks every stream found that is not
// parked here yet. A new owner calls it before its fence passes, so a park
// that landed while the watch was away holds the stream's later events.
// Entries gone from the bucket are left to the watch (it unparks them).
func (pk *Parking) Reread(ctx context.Context) error {
	kv := pk.kv()
	if kv == nil {
		return errNotProvisioned
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := kv.ListKeysFiltered(ctx, wire.ParkedFilter(pk.sub))
	if err != nil {
		return fmt.Errorf("list parked streams of subscription %q: %w", pk.sub, err)
	}
	defer func() { _ = keys.Stop() }()
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // unparked meanwhile
		}
		if err != nil {
			return fmt.Errorf("read park entry %q: %w", k, err)
		}
		var ps deadletter.ParkedStream
		if err := json.Unmarshal(e.Value(), &ps); err != nil {
			pk.log.Warn("unreadable park entry; ignored", slog.String("key", k), slog.Any("error", err))
			continue
		}
		pk.mu.Lock()
		if cur := pk.parked[k]; cur == nil {
			pk.log.Info("a stream parked while the watch was away; holding it", slog.String("stream", ps.Stream))
			pk.parked[k] = &parkedStream{entry: ps}
		}
		pk.mu.Unlock()
	}
	return ctx.Err()
}

// watchParked follows the park bucket's entries of the subscription until
// ctx ends, closing ready once the existing ones are loaded (partitions
// start only then, so a parked stream is never delivered).
func (pk *Parking) WatchParked(ctx context.Context, kv jetstream.KeyValue, ready chan struct{}) {
	readied := false
	for ctx.Err() == nil {
		w, err := kv.Watch(ctx, wire.ParkedFilter(pk.sub))
		if err != nil {
			pk.log.Warn("watching parked streams failed; retrying", slog.Any("error", err))
			pk.failed(ctx, err)
			select {
			case <-ctx.Done():
			case <-pk.clock.After(time.Second):
			}
			continue
		}
		// A (re)started watch sends every entry, then nil: a stream parked
		// here whose entry is not among them was unparked meanwhile.
		initial := map[string]bool{}
		// The watch's updates end only when it stops, and not even then
		// when it was stopped as nats.go was still setting it up (its
		// channel is closed by a handler set after the subscription):
		// the loop also ends with ctx, or Run would wait for it forever
		// at shutdown.
		for {
			var e jetstream.KeyValueEntry
			var open bool
			select {
			case e, open = <-w.Updates():
			case <-ctx.Done():
			}
			if !open {
				break
			}
			if e == nil {
				if initial != nil {
					pk.mu.Lock()
					var gone []string
					for bk := range pk.parked {
						if !initial[bk] {
							gone = append(gone, bk)
						}
					}
					pk.mu.Unlock()
					for _, bk := range gone {
						pk.unpark(bk)
					}
					initial = nil
				}
				if !readied {
					close(ready)
					readied = true
				}
				continue
			}
			if initial != nil {
				initial[e.Key()] = true
			}
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var ps deadletter.ParkedStream
				if err := json.Unmarshal(e.Value(), &ps); err != nil {
					pk.log.Warn("unreadable park entry; ignored", slog.String("key", e.Key()), slog.Any("error", err))
					continue
				}
				pk.mu.Lock()
				if cur := pk.parked[e.Key()]; cur == nil {
					pk.parked[e.Key()] = &parkedStream{entry: ps}
				} else {
					cur.entry.HeadEventID, cur.releasing = ps.HeadEventID, false
				}
				pk.mu.Unlock()
			case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
				pk.unpark(e.Key())
			}
		}
		_ = w.Stop()
	}
}

// keepParkedAlive sends InProgress for the held events every AckWait/2, and
// updates the parked-stream metrics and the owner's held counts in the
// park bucket, until ctx ends. A parked stream whose oldest held event
// nears or passes the copy's MaxAge gets the cause in its entry (see
// riskOf) and an error in the log, once per stage.
func (pk *Parking) KeepAlive(ctx context.Context) {
	t := pk.clock.NewTicker(min(pk.ackWait/2, 5*time.Second))
	defer t.Stop()
	type state struct {
		held int
		risk ordercopy.Risk
	}
	reported := map[string]state{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		type report struct {
			key    string
			entry  deadletter.ParkedStream
			held   int
			oldest time.Time
			risk   ordercopy.Risk
			atRisk jetstream.Msg // the held event longest in the copy
			inCopy time.Time     // since when
		}
		var msgs []heldMsg
		var reports []report
		oldest := time.Time{}
		now := pk.clock.Now()
		maxAge := pk.copyMaxAge()
		pk.mu.Lock()
		n, stuck := len(pk.parked), 0
		for k, ps := range pk.parked {
			if ps.entry.OrderStuck {
				stuck++
			}
			rp := report{key: k, entry: ps.entry, held: len(ps.held)}
			for _, h := range ps.held {
				msgs = append(msgs, h)
				if rp.oldest.IsZero() || h.at.Before(rp.oldest) {
					rp.oldest = h.at
				}
				if md, err := h.msg.Metadata(); err == nil && (rp.inCopy.IsZero() || md.Timestamp.Before(rp.inCopy)) {
					rp.atRisk, rp.inCopy = h.msg, md.Timestamp
				}
			}
			if !rp.oldest.IsZero() && (oldest.IsZero() || rp.oldest.Before(oldest)) {
				oldest = rp.oldest
			}
			rp.risk = ordercopy.RiskOf(rp.inCopy, now, maxAge)
			// A stream whose held events were set aside (held 0 now)
			// is reported too: its entry must not keep the old count.
			if reported[k] != (state{rp.held, rp.risk}) {
				reports = append(reports, rp)
			}
		}
		pk.mu.Unlock()
		for _, x := range msgs {
			_ = x.h.InProgress(x.msg) // not past its partition's lease, nor while disconnected
		}
		age := 0.0
		if !oldest.IsZero() {
			age = pk.clock.Since(oldest).Seconds()
		}
		pk.setGauges(n, stuck, age)
		for _, rp := range reports {
			e := rp.entry
			e.Held, e.OldestHeldAt, e.UpdatedAt, e.Replica = rp.held, rp.oldest.UTC(), now.UTC(), pk.replicaID
			if rp.risk != ordercopy.RiskNone {
				id := attempt.EventID(rp.atRisk)
				e.Error = ordercopy.RiskError(rp.risk, pk.copyStream, id, rp.inCopy, now, maxAge, pk.replicaID)
				e.AtRiskEventID, e.AtRiskEventTime, e.CopyMaxAge = id, rp.inCopy.UTC(), maxAge
				if reported[rp.key].risk != rp.risk {
					pk.log.Error("a parked stream's held event nears or passed the partitioned copy's MaxAge: "+e.Error,
						slog.String("stream", e.Stream), slog.String("event_id", id), slog.Duration("age", now.Sub(rp.inCopy).Round(time.Millisecond)),
						slog.Duration("max_age", maxAge))
				}
			}
			v, err := json.Marshal(e)
			if err != nil {
				continue
			}
			// Put only over an existing entry: one deleted meanwhile
			// (replayed or skipped) must stay deleted.
			kv := pk.kv()
			if kv == nil {
				continue
			}
			if cur, err := kv.Get(ctx, rp.key); err == nil {
				if _, err := kv.Update(ctx, rp.key, v, cur.Revision()); err == nil {
					reported[rp.key] = state{rp.held, rp.risk}
				}
			}
		}
	}
}

// setGauges sets the subscription's parked, order-stuck and oldest-held
// gauges (those not nil).
func (pk *Parking) setGauges(parked, stuck int, oldestHeld float64) {
	if g := pk.metrics.Parked; g != nil {
		g.WithLabelValues(pk.sub).Set(float64(parked))
	}
	if g := pk.metrics.OrderStuck; g != nil {
		g.WithLabelValues(pk.sub).Set(float64(stuck))
	}
	if g := pk.metrics.OldestHeld; g != nil {
		g.WithLabelValues(pk.sub).Set(oldestHeld)
	}
}

// errNotProvisioned is returned by what needs the park bucket before
// Provisioned handed it.
var errNotProvisioned = errors.New("park: the park bucket is not provisioned yet")

// streamSeq is a message's sequence in the partitioned copy (0 when it
// has no metadata).
func streamSeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}
