package park

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/attempt"
	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/wire"
)

// Park records m's stream as parked behind m (already dead-lettered). An
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

// IsParked reports whether the stream of subject (in the partitioned
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

// Hold keeps m, pulled by h, when its stream is parked (or unparked and
// not yet released) and reports whether it did; held events are kept in
// stream order. A redelivered head (dead-lettered, but its ack lost) is
// acked instead (h.Ack), and reported held.
func (pk *Parking) Hold(h *Holder, m jetstream.Msg) bool {
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

// ReturnHeld Naks the events held for h's streams (h is being released:
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

// HeldBy returns the parked streams (not releasing) with events held for
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

// TakeHeld removes the events of subject's stream (a subject in the
// partitioned copy) held for h and returns them, in stream order: the
// partition sets the stream aside. The stream stays parked.
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

// AddHeld adds to seqs the stream sequences of the events held for h.
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
// (ReleaseFor), before any newer event it pulls.
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

// ReleaseFor removes the releasing streams whose held events are all h's
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
