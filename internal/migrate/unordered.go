package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/migrate/legacy"
	"github.com/jsbridge/jsbridge/wire"
)

// unordered plans an unordered subscription: a "behind" cursor from its
// durable's ack floor on every partition. Between the floor and the last
// delivered sequence some events were acked and some are pending; with
// Config.ReadPending the pending ones are read back (legacy.PendingSet) and the
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
	all, err := legacy.ListTaken(ctx, events, legacy.Filters(info.Config), sp.Floor+1, sp.Delivered)
	if err != nil {
		return sp, err
	}
	var above []legacy.Taken // acked above the floor, when known
	exact := sp.Pending == 0
	if !exact && r.cfg.ReadPending {
		pending, err := legacy.PendingSet(ctx, c, info, r.cfg.Clock)
		if err != nil {
			return sp, err
		}
		if exact = len(pending) == sp.Pending; exact {
			sp.Notes = append(sp.Notes, fmt.Sprintf("its %d pending events were read back: the events of (%d, %d] it acked are not sent again", len(pending), sp.Floor, sp.Delivered))
		} else {
			sp.Notes = append(sp.Notes, fmt.Sprintf("%d of its %d pending events came back within %s (AckWait plus its longest BackOff step, plus %s): the events of (%d, %d] not seen may have been acked and are sent again",
				len(pending), sp.Pending, legacy.PendingBound(info.Config), legacy.PendingMargin, sp.Floor, sp.Delivered))
		}
		if exact {
			above = slices.DeleteFunc(all, func(m legacy.Taken) bool { return pending[m.Seq] })
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
		if p, ok := wire.SubjectPartition(r.prefix, m.Subject, r.cfg.Partitions); ok {
			byPartition[p] = append(byPartition[p], m.Seq)
		} // else no source stream's event: the new engine passes over it
	}
	for p := range r.cfg.Partitions {
		r.plan.Cursors = append(r.plan.Cursors, CursorPlan{Subscription: name, Partition: p,
			Cursor: position.Cursor{State: StateBehind, Floor: sp.Floor, Above: byPartition[p]}})
	}
	return sp, nil
}
