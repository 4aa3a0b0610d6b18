package migratetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/deadletter"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// Outcome is what became of one event the old engine delivered to a
// subscription before it was stopped.
type Outcome int

const (
	// Accepted: the endpoint answered 2xx, and the event was acked
	// (ordered: settled, its stream went on).
	Accepted Outcome = iota
	// InFlight: delivered, not answered when the old engine stopped:
	// pending (ordered: its stream's later events wait behind it,
	// pending too).
	InFlight
	// Failing: answered 5xx and retried: pending, Nak'd with
	// Durable.NakDelay when set (ordered: retried in place as its
	// stream's head, the later events waiting behind it, pending).
	Failing
	// SetAside: ordered only: the head retried in place like Failing,
	// its stream's later events acked out behind an aside record
	// (legacy.AsideRecord, read again from the first of them).
	SetAside
	// Refused: answered with a permanent failure: dead-lettered and
	// acked (ordered: its stream parked behind it, with a park entry and
	// its skipped version; the later events held, pending).
	Refused
)

// Event is one event the old engine delivered to a subscription.
type Event struct {
	// Seq is its events stream sequence, Subject its subject there.
	Seq     uint64
	Subject string
	// ID is its event id (Nats-Msg-Id), Stream its stream's name.
	ID     string
	Stream string
	// Version is its ce-streamversion, -1 when it carries none.
	Version int64
}

// Sent is an event the endpoint accepted from the old engine, as sent.
type Sent struct {
	Event
	// Previous is the version its ordered webhook named before it
	// (wire.PreviousNone for none); "" for an unordered one.
	Previous string
	// Epoch is the lease epoch its ordered webhook carried
	// (Layout.Epoch); 0 for an unordered one.
	Epoch uint64
}

// Deliver plays unordered subscription name's durable (made when
// missing) delivering the events stream up to through
// (0: its last message now), in pulls of at most 256, each event's fate
// given by outcome (SetAside counts as Failing). It returns the events
// accepted, by sequence. A pending event that comes back while it pulls
// stays pending. The events stream must hold every sequence up to
// through (a deleted one makes it pull past through).
func (l *Layout) Deliver(ctx context.Context, name string, d Durable, through uint64, outcome func(Event) Outcome) ([]Sent, error) {
	c, err := l.unorderedDurable(ctx, name, d)
	if err != nil {
		return nil, err
	}
	info, err := l.Events.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("migratetest: %w", err)
	}
	if through == 0 {
		through = info.State.LastSeq
	}
	var sent []Sent
	for last := max(c.CachedInfo().Delivered.Stream, max(info.State.FirstSeq, 1)-1); last < through; {
		msgs, got, err := fetch(c, int(min(through-last, 256)))
		if err != nil || !got {
			return sent, err
		}
		for _, m := range msgs {
			md, _ := m.Metadata()
			last = max(last, md.Sequence.Stream)
			ev := l.event(md.Sequence.Stream, m)
			switch outcome(ev) {
			case Accepted:
				err = m.DoubleAck(ctx)
				sent = append(sent, Sent{Event: ev})
			case Failing, SetAside:
				if d.NakDelay > 0 {
					err = m.NakWithDelay(d.NakDelay)
				}
			case Refused:
				if err = l.DLQ.DeadLetter(ctx, refused(name, d, ev, m)); err == nil {
					err = m.DoubleAck(ctx)
				}
			}
			if err != nil {
				return sent, fmt.Errorf("migratetest: %s at %d: %w", name, ev.Seq, err)
			}
		}
	}
	return sent, nil
}

// fetch pulls up to n messages from c without waiting, and returns
// those delivered for the first time (a pending one that comes back stays
// pending); got is false when nothing came.
func fetch(c jetstream.Consumer, n int) (msgs []jetstream.Msg, got bool, err error) {
	batch, err := c.FetchNoWait(n)
	if err != nil {
		return nil, false, fmt.Errorf("migratetest: pull: %w", err)
	}
	for m := range batch.Messages() {
		got = true
		if md, err := m.Metadata(); err != nil {
			return nil, got, fmt.Errorf("migratetest: %w", err)
		} else if md.NumDelivered == 1 {
			msgs = append(msgs, m)
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return msgs, got, fmt.Errorf("migratetest: pull: %w", err)
	}
	return msgs, got, nil
}

// event describes message m, stored at seq on the events stream.
func (l *Layout) event(seq uint64, m jetstream.Msg) Event {
	subject := legacy.EventsSubject(l.Prefix, m.Subject())
	ev := Event{Seq: seq, Subject: subject, ID: m.Headers().Get(wire.HeaderMsgID), Version: -1}
	ev.Stream, _, _ = wire.ParseSubject(l.Prefix, subject)
	if v, err := strconv.ParseInt(m.Headers().Get(wire.HeaderStreamVersion), 10, 64); err == nil && v >= 0 {
		ev.Version = v
	}
	return ev
}

// lane is one stream of a partition while DeliverOrdered plays it.
type lane struct {
	blocked  bool   // a head waits (in flight, failing, set aside, parked): the later events wait
	previous int64  // the last version accepted; deadletter.NoPrevious: none
	settled  uint64 // the copy sequence of the last event settled (accepted or dead-lettered)
	aside    *legacy.AsideRecord
	// subject is a subject of the stream in the copy.
	subject string
}

// DeliverOrdered plays ordered subscription name's partition consumers
// (made when missing, PartitionConsumers) delivering every event the
// copy holds (after WaitCopied), partition by partition, each stream in
// order: an event's fate is given by outcome while its stream is not
// blocked; from an event not Accepted on, the stream's later events wait
// (pending), or are acked out behind an aside record (SetAside). What the
// old engine's partitions left at a graceful stop is left: each event
// settled above the partition consumer's ack floor in the delivered
// record, a refused head dead-lettered (its chain headers, the partition
// and Layout.Epoch on the dead letter), its version recorded as skipped
// and its stream parked. It returns the events accepted, each with the
// version chain's predecessor it named, by sequence.
func (l *Layout) DeliverOrdered(ctx context.Context, name string, d Durable, outcome func(Event) Outcome) ([]Sent, error) {
	if err := l.WaitCopied(ctx); err != nil {
		return nil, err
	}
	cons, err := l.PartitionConsumers(ctx, name, d)
	if err != nil {
		return nil, err
	}
	var sent []Sent
	for p, c := range cons {
		more, err := l.deliverPartition(ctx, name, d, p, c, outcome)
		if err != nil {
			return nil, err
		}
		sent = append(sent, more...)
	}
	slices.SortFunc(sent, func(a, b Sent) int { return cmp.Compare(a.Seq, b.Seq) })
	return sent, nil
}

// deliverPartition is DeliverOrdered's partition p, consumer c.
func (l *Layout) deliverPartition(ctx context.Context, name string, d Durable, p int, c jetstream.Consumer, outcome func(Event) Outcome) ([]Sent, error) {
	lanes := map[string]*lane{}
	var sent []Sent
	for {
		msgs, got, err := fetch(c, 256)
		if err != nil {
			return nil, err
		}
		if !got {
			break
		}
		for _, m := range msgs {
			md, _ := m.Metadata()
			ev := l.event(wire.SourceSequence(m.Headers().Get(wire.HeaderSourceInfo)), m)
			key := wire.StreamKey(ev.Subject)
			ln := lanes[key]
			if ln == nil {
				ln = &lane{previous: deadletter.NoPrevious, subject: m.Subject()}
				lanes[key] = ln
			}
			if s, err := l.play(ctx, name, d, p, m, md.Sequence.Stream, ev, ln, outcome); err != nil {
				return nil, fmt.Errorf("migratetest: %s partition %d at copy %d: %w", name, p, md.Sequence.Stream, err)
			} else if s != nil {
				sent = append(sent, *s)
			}
		}
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("migratetest: %w", err)
	}
	streams := map[string]uint64{}
	for _, ln := range lanes {
		if ln.settled > info.AckFloor.Stream {
			streams[wire.StreamKey(ln.subject)] = ln.settled
		}
		if ln.aside != nil && ln.aside.Start != 0 { // else nothing was set aside
			if err := l.putJSON(ctx, legacy.AsideKey(name, p, wire.StreamKey(ln.aside.Subject)), *ln.aside); err != nil {
				return nil, err
			}
		}
	}
	if len(streams) > 0 {
		if err := l.putJSON(ctx, legacy.DeliveredKey(name, p), legacy.DeliveredRecord{Copy: l.CopyAt.UnixNano(), Streams: streams}); err != nil {
			return nil, err
		}
	}
	return sent, nil
}

// play settles ev (copy message m at copySeq, of partition p) on its
// lane ln as the old engine did, and returns it when it was accepted.
func (l *Layout) play(ctx context.Context, name string, d Durable, p int, m jetstream.Msg, copySeq uint64, ev Event, ln *lane, outcome func(Event) Outcome) (*Sent, error) {
	if ln.aside != nil {
		if ln.aside.Start == 0 {
			ln.aside.Start, ln.aside.From = copySeq, copySeq
		}
		return nil, m.DoubleAck(ctx)
	}
	if ln.blocked {
		return nil, nil
	}
	switch o := outcome(ev); o {
	case Accepted:
		s := &Sent{Event: ev, Previous: wire.FormatPreviousVersion(ln.previous), Epoch: l.Epoch}
		ln.previous, ln.settled = ev.Version, copySeq
		return s, m.DoubleAck(ctx)
	case SetAside:
		ln.blocked = true
		ln.aside = &legacy.AsideRecord{Subject: m.Subject(), Head: copySeq}
		return nil, nil
	case Refused:
		ln.blocked = true
		if err := l.park(ctx, name, d, p, ev, ln.previous); err != nil {
			return nil, err
		}
		ln.settled = copySeq
		return nil, m.DoubleAck(ctx)
	default: // InFlight, Failing
		ln.blocked = true
		if o == Failing && d.NakDelay > 0 {
			return nil, m.NakWithDelay(d.NakDelay)
		}
		return nil, nil
	}
}

// park dead-letters ev (its webhook named previous before it) for
// ordered subscription name, records its version as skipped, and parks
// its stream behind it.
func (l *Layout) park(ctx context.Context, name string, d Durable, p int, ev Event, previous int64) error {
	m, err := l.eventMsg(ctx, ev.Seq)
	if err != nil {
		return err
	}
	dl := refused(name, d, ev, m)
	dl.Previous, dl.Partition, dl.Epoch = wire.FormatPreviousVersion(previous), strconv.Itoa(p), strconv.FormatUint(l.Epoch, 10)
	if err := l.DLQ.DeadLetter(ctx, dl); err != nil {
		return err
	}
	key := wire.StreamKey(ev.Subject)
	if ev.Version >= 0 {
		if err := deadletter.RecordSkipped(ctx, l.Park, name, key, ev.Version, previous); err != nil {
			return err
		}
	}
	return l.putJSON(ctx, legacy.ParkedKey(name, key), legacy.ParkEntry{
		Subscription: name, Stream: ev.Stream, Subject: ev.Subject, HeadEventID: ev.ID, Partition: p,
	})
}

// refused is the dead letter of ev (its message m on the events stream)
// refused by subscription name's endpoint with a 422.
func refused(name string, d Durable, ev Event, m jetstream.Msg) deadletter.Letter {
	dl := deadletter.Letter{Subscription: name, Endpoint: d.Endpoint, EventID: ev.ID, Attempt: 1, Status: 422,
		Reason: "HTTP 422 Unprocessable Entity", Event: deadletter.Event{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}}
	if md, err := m.Metadata(); err == nil {
		dl.Event.Seq, dl.Event.Time = md.Sequence.Stream, md.Timestamp
	}
	return dl
}
