package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/wire"
)

// pendingMargin is added to a durable's AckWait and longest BackOff step
// when its pending set is read back: the server moves an expired
// delivery to its redelivery queue on a timer of its own.
const pendingMargin = 2 * time.Second

// unordered plans an unordered subscription: a "behind" cursor from its
// durable's ack floor on every partition. Between the floor and the last
// delivered sequence some events were acked and some are pending; with
// Config.ReadPending the pending ones are read back (pendingSet) and the
// acked ones go into the cursors' Above, else the acked ones are counted
// as sent again.
func (r *reading) unordered(ctx context.Context, name string) (SubscriptionPlan, error) {
	sp := SubscriptionPlan{Name: name}
	c, err := r.js.Consumer(ctx, r.cfg.Events, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		sp.Notes = append(sp.Notes, "no durable consumer on "+r.cfg.Events+": nothing to move, it starts as a new subscription from its start position")
		return sp, nil
	}
	if err != nil {
		return sp, fmt.Errorf("migrate: subscription %q: durable consumer on %q: %w", name, r.cfg.Events, err)
	}
	info := c.CachedInfo()
	sp.Floor, sp.Delivered, sp.Pending = info.AckFloor.Stream, info.Delivered.Stream, info.NumAckPending
	events, err := r.js.Stream(ctx, r.cfg.Events)
	if err != nil {
		return sp, fmt.Errorf("migrate: events stream %q: %w", r.cfg.Events, err)
	}
	all, err := listTaken(ctx, events, filters(info.Config), sp.Floor+1, sp.Delivered)
	if err != nil {
		return sp, err
	}
	var above []taken // acked above the floor, when known
	exact := sp.Pending == 0
	if !exact && r.cfg.ReadPending {
		pending, err := pendingSet(ctx, c, info, r.cfg.Clock)
		if err != nil {
			return sp, err
		}
		if exact = len(pending) == sp.Pending; exact {
			sp.Notes = append(sp.Notes, fmt.Sprintf("its %d pending events were read back: the events of (%d, %d] it acked are not sent again", len(pending), sp.Floor, sp.Delivered))
		} else {
			sp.Notes = append(sp.Notes, fmt.Sprintf("%d of its %d pending events came back within %s (AckWait plus its longest BackOff step, plus %s): the events of (%d, %d] not seen may have been acked and are sent again",
				len(pending), sp.Pending, pendingBound(info.Config), pendingMargin, sp.Floor, sp.Delivered))
		}
		if exact {
			above = slices.DeleteFunc(all, func(m taken) bool { return pending[m.seq] })
		}
	}
	switch {
	case exact && sp.Pending == 0:
		above = all
	case !exact && uint64(len(all)) > uint64(sp.Pending):
		sp.Resent = uint64(len(all)) - uint64(sp.Pending)
	}
	byPartition := make([][]uint64, r.cfg.Partitions)
	for _, m := range above {
		if p, ok := wire.SubjectPartition(r.prefix, m.subject, r.cfg.Partitions); ok {
			byPartition[p] = append(byPartition[p], m.seq)
		} // else no source stream's event: the new engine passes over it
	}
	for p := range r.cfg.Partitions {
		r.plan.Cursors = append(r.plan.Cursors, CursorPlan{Subscription: name, Partition: p,
			Cursor: position.Cursor{State: StateBehind, Floor: sp.Floor, Above: byPartition[p]}})
	}
	return sp, nil
}

// pendingBound is how long a pending event of a durable with cfg may
// take to come back: AckWait plus its longest BackOff step.
func pendingBound(cfg jetstream.ConsumerConfig) time.Duration {
	d := cfg.AckWait
	for _, b := range cfg.BackOff {
		d = max(d, b)
	}
	return d
}

// pendingSet reads durable c's pending set back (the design's section 5):
// with every replica stopped, JetStream redelivers exactly the events
// delivered and not acked once their AckWait (or Nak delay) passed,
// before anything new. It pulls, never acking, until it has seen
// info.NumAckPending redeliveries (NumDelivered > 1) at or below the last
// delivered sequence, or for the bound (pendingBound + pendingMargin, on
// clock), and returns their sequences. Each pull
// counts as a delivery of its events on the old durable; events past the
// last delivered sequence it pulls stay pending there.
func pendingSet(ctx context.Context, c jetstream.Consumer, info *jetstream.ConsumerInfo, clock clockwork.Clock) (map[uint64]bool, error) {
	seen := map[uint64]bool{}
	last := info.Delivered.Stream
	deadline := clock.Now().Add(pendingBound(info.Config) + pendingMargin)
	for len(seen) < info.NumAckPending {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		left := deadline.Sub(clock.Now())
		if left <= 0 {
			break
		}
		fctx, cancel := context.WithTimeout(ctx, min(left, time.Second))
		batch, err := c.Fetch(info.NumAckPending-len(seen), jetstream.FetchContext(fctx))
		if err != nil && fctx.Err() != nil && ctx.Err() == nil {
			// The round's time ran out before the pull was sent (nats.go
			// refuses a context already past its deadline): the next
			// round, or the bound, decides.
			cancel()
			continue
		}
		if err != nil {
			cancel()
			return nil, fmt.Errorf("migrate: read the pending events of durable %q back: %w", info.Name, err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err == nil && md.NumDelivered > 1 && md.Sequence.Stream <= last {
				seen[md.Sequence.Stream] = true
			}
		}
		err = batch.Error()
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoHeartbeat) {
			return nil, fmt.Errorf("migrate: read the pending events of durable %q back: %w", info.Name, err)
		}
	}
	return seen, nil
}

// filters are a consumer's filter subjects (none: everything).
func filters(cfg jetstream.ConsumerConfig) []string {
	f := slices.Clone(cfg.FilterSubjects)
	if cfg.FilterSubject != "" {
		f = append(f, cfg.FilterSubject)
	}
	if len(f) == 0 {
		f = []string{">"}
	}
	return f
}

// taken is a message a consumer takes: its sequence and subject.
type taken struct {
	seq     uint64
	subject string
}

// listTaken lists s's messages in [from, to] on any of filters (which a
// consumer keeps from overlapping), by sequence: one message get each,
// next by subject.
func listTaken(ctx context.Context, s jetstream.Stream, filters []string, from, to uint64) ([]taken, error) {
	var out []taken
	for _, f := range filters {
		for seq := from; seq <= to; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(f))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("migrate: read JetStream stream %q from %d on %q: %w", s.CachedInfo().Config.Name, seq, f, err)
			}
			if m.Sequence > to {
				break
			}
			out = append(out, taken{m.Sequence, m.Subject})
			seq = m.Sequence + 1
		}
	}
	slices.SortFunc(out, func(a, b taken) int { return cmpU(a.seq, b.seq) })
	return out, nil
}
